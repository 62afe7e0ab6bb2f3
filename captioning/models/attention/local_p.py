"""Luong et al. 2015's local attention as published (Eq. 9-10) on the 2-D grid, ``window: local_p | local_m``:

    local_p  p_t = (gh - 1, gw - 1) * sigmoid(v_p^T tanh(W_p h))      a predicted centre (row, column)
    local_m  p_t = the cell of step t in raster order: (t mod L) // gw, (t mod L) mod gw
    window   W_t = the cells i with |row_i - row(p_t)| <= D and |col_i - col(p_t)| <= D  (a square)
    alpha_ti = align_i(e_t) exp(-|cell_i - p_t|^2 / (2 sigma^2)) on W_t, 0 elsewhere,  sigma = D / 2

align is the normaliser (softmax) over the window's cells only; the Gaussian is multiplied in and
NOT renormalised, so alpha_t sums to less than 1. D is ``local_width``. Text has a monotonic
order; a grid has none, so local_m's "monotonic" walks the cells row by row, one per word (t
counts from 0). (``window: local`` is the renormalised, untruncated form.) The picture's view
(N, 3): the centre's row and column and D, in cells.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.models.attention.local import grid_cells
from captioning.models.decoder import WINDOWS


def check_grid(window: str, width: int, gh: int, gw: int) -> None:
    """A one-line ConfigError for a grid the window cannot be local on."""
    if gh * gw == 1:
        raise ConfigError(f"model.decoder.window: {window} needs a grid of several cells; this encoder gives 1x1")
    if 2 * width + 1 > max(gh, gw):
        raise ConfigError(
            f"model.decoder.local_width: a {window} window of {2 * width + 1}x{2 * width + 1} cells (D = {width}) "
            f"is wider than the {gh}x{gw} grid; use local_width <= {(max(gh, gw) - 1) // 2}"
        )


def truncated_window(e: Tensor, centre: Tensor, width: int, normalize, gh: int, gw: int) -> Tensor:
    """alpha_t from the scores e (N, L) or (N, heads, L) and the centre p_t (N, 2), in cells."""
    offset = grid_cells(gh, gw, centre.device, centre.dtype) - centre.unsqueeze(1)  # (N, L, 2)
    inside = (offset.abs() <= width).all(-1)  # (N, L): the window W_t
    gaussian = torch.exp(-(offset**2).sum(-1) / (2 * (width / 2) ** 2))  # sigma = D / 2
    if e.dim() == 3:
        inside, gaussian = inside.unsqueeze(1), gaussian.unsqueeze(1)
    align = normalize(e.masked_fill(~inside, float("-inf")))  # over the window's cells only; 0 outside
    return align * gaussian


def view(centre: Tensor, width: int) -> Tensor:
    """What the pictures show: (N, 3) the centre's row and column and D."""
    return torch.cat([centre, centre.new_full((centre.size(0), 1), float(width))], 1)


@WINDOWS.register("local_p")
class LocalPWindow(nn.Module):
    """The predicted centre (Luong's Eq. 9, without biases, one v_p row per coordinate)."""

    def __init__(self, hidden_dim: int, attention_dim: int, config, feature_dim: int | None = None):
        super().__init__()
        self.W_p = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.v_p = nn.Linear(attention_dim, 2, bias=False)
        self.width = config.local_width

    def centre(self, h: Tensor, gh: int, gw: int) -> Tensor:
        """p_t (N, 2) as (row, column) in [0, gh - 1] x [0, gw - 1]."""
        return torch.sigmoid(self.v_p(torch.tanh(self.W_p(h)))) * h.new_tensor([gh - 1, gw - 1])

    def forward(self, e: Tensor, h: Tensor, state, normalize) -> tuple[Tensor, Tensor]:
        gh, gw = grid_shape(state.features.size(1))
        check_grid("local_p", self.width, gh, gw)
        centre = self.centre(h, gh, gw)
        return truncated_window(e, centre, self.width, normalize, gh, gw), view(centre, self.width)


@WINDOWS.register("local_m")
class LocalMWindow(nn.Module):
    """The monotonic centre: step t's cell in raster order (no parameters)."""

    def __init__(self, hidden_dim: int, attention_dim: int, config, feature_dim: int | None = None):
        super().__init__()
        self.width = config.local_width

    def forward(self, e: Tensor, h: Tensor, state, normalize) -> tuple[Tensor, Tensor]:
        gh, gw = grid_shape(state.features.size(1))
        check_grid("local_m", self.width, gh, gw)
        if state.t is None:
            raise ValueError("local_m reads the steps taken (DecoderState.t); the state has none")
        cell = state.t % (gh * gw)  # (N,)
        centre = torch.stack([cell // gw, cell % gw], 1).to(e.dtype)
        return truncated_window(e, centre, self.width, normalize, gh, gw), view(centre, self.width)
