"""Several attention heads (``heads: k``): each head's weights make its own context (and, for hard
attention, its own location), and the contexts are joined and projected back to D:

    z^_t = W_o [z^_t,1; ...; z^_t,k]

The score gives alpha (N, heads, L); alpha returned for the pictures is the heads' mean.
"""

from __future__ import annotations

from torch import nn

from captioning.models.decoder import Glimpse, glimpse


class MultiHead(nn.Module):
    """The heads' glimpses, joined by W_o (heads * D -> D)."""

    def __init__(self, feature_dim: int, heads: int):
        super().__init__()
        self.W_o = nn.Linear(heads * feature_dim, feature_dim, bias=False)

    def forward(self, alpha, features, mode, use_expected=None, location=None, beams=1, temperature=1.0) -> Glimpse:
        """alpha (N, heads, L): each head is one more row of its image (rows image, beam, head)."""
        N, k, L = alpha.shape
        g = glimpse(
            alpha.reshape(N * k, L),
            features,
            mode,
            None if use_expected is None else use_expected.repeat_interleave(k),
            None if location is None else location.reshape(N * k),
            beams * k,
            temperature,
        )
        mean = alpha.mean(1)
        where = mean.argmax(-1) if mode == "expected" else g.location.view(N, k)
        return Glimpse(
            self.W_o(g.context.view(N, k * features.size(-1))),
            mean,
            where,
            None if g.log_prob is None else g.log_prob.view(N, k).sum(1),
            None if g.entropy is None else g.entropy.view(N, k).sum(1),
            head_alpha=alpha,
        )
