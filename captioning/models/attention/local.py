"""Local attention on the grid (Luong et al. 2015's local-p in two dimensions), ``window: local``:

    p_t     = (gh - 1, gw - 1) * sigmoid(v_p^T tanh(W_p h))        the predicted centre, in cells
    alpha_t = softmax(e_t - |cell_i - p_t|^2 / (2 sigma^2))         the Gaussian multiplied in and renormalised

sigma is ``local_sigma`` cells. (Luong's own local-p truncates the window and does not renormalise.)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.models.decoder import WINDOWS


def grid_cells(gh: int, gw: int, device=None, dtype=torch.float32) -> Tensor:
    """(L, 2): the (row, column) of every location, row-major as the encoders flatten them."""
    rows = torch.arange(gh, device=device, dtype=dtype).repeat_interleave(gw)
    cols = torch.arange(gw, device=device, dtype=dtype).repeat(gh)
    return torch.stack([rows, cols], 1)


@WINDOWS.register("local")
class LocalWindow(nn.Module):
    """The predicted centre and the Gaussian window's log added to the scores."""

    def __init__(self, hidden_dim: int, attention_dim: int, config, feature_dim: int | None = None):
        super().__init__()
        self.W_p = nn.Linear(hidden_dim, attention_dim)
        self.v_p = nn.Linear(attention_dim, 2)
        self.sigma = config.local_sigma

    def centre(self, h: Tensor, gh: int, gw: int) -> Tensor:
        """p_t (N, 2) as (row, column) in [0, gh - 1] x [0, gw - 1]."""
        return torch.sigmoid(self.v_p(torch.tanh(self.W_p(h)))) * h.new_tensor([gh - 1, gw - 1])

    def log_window(self, centre: Tensor, gh: int, gw: int) -> Tensor:
        """-|cell - p_t|^2 / (2 sigma^2): centre (N, 2) -> (N, L)."""
        d2 = ((centre.unsqueeze(1) - grid_cells(gh, gw, centre.device, centre.dtype)) ** 2).sum(-1)
        return d2 * (-0.5 / self.sigma**2)

    def forward(self, e: Tensor, h: Tensor, state, normalize) -> tuple[Tensor, Tensor]:
        """alpha_t from the scores e (N, L) or (N, heads, L) and the state h (N, H) attended from,
        ``normalize`` (softmax) over the scores plus the window's log; and the window shown (N, 3):
        its centre (row, column) and sigma, in cells."""
        gh, gw = grid_shape(state.features.size(1))
        centre = self.centre(h, gh, gw)
        log_w = self.log_window(centre, gh, gw)
        alpha = normalize(e + (log_w.unsqueeze(1) if e.dim() == 3 else log_w))
        return alpha, torch.cat([centre, centre.new_full((centre.size(0), 1), self.sigma)], 1)
