"""Soft and hard attention over the L annotation vectors (paper Section 4).

Both kinds share the scoring network of Eq. 4-5,

    e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b),    alpha_t = softmax(e_t),

and differ in how the context z_t is made from alpha_t (Section 4.1 and 4.2):

- soft (deterministic): the expected context  z_t = sum_i alpha_ti a_i            (Eq. 13)
- hard (stochastic):    a sampled location    s_t ~ Categorical(alpha_t),  z_t = a_{s_t}  (Eq. 8-9)

W_a a_i does not depend on t, so :meth:`AdditiveAttention.project` computes it once per batch and
every step reuses it.

The scores are computed through the identity tanh(y) = 2 sigmoid(2y) - 1,

    e_ti = (2w)^T sigmoid(2 W_a a_i + 2 W_h h_{t-1} + 2b) + (b_w - sum(w)),

which is the same number (and the same gradient): on the CPU, sigmoid over the (B, L, A) tensor
is several times faster than tanh, and this elementwise pass is the largest of a decoding step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from captioning.models import ATTENTION_MODES


#: Decoding on the CPU computes the attention scores a few images at a time, about this many
#: values of the (images, K, L, A) tensor at once (4 MB in float32).
CPU_CHUNK_ELEMENTS = 1024 * 1024


class AdditiveAttention(nn.Module):
    """The attention model f_att of Eq. 4: scores for every location from a_i and h_{t-1}.

    The hidden-side projection W_h h_{t-1} is not done here: the decoder fuses it with its other
    matrix products of h_{t-1} into one (see :class:`~captioning.models.decoder.ShowAttendTellDecoder`),
    and passes the result in as ``h_att``.
    """

    def __init__(self, feature_dim: int, attention_dim: int):
        super().__init__()
        self.feature_proj = nn.Linear(feature_dim, attention_dim)  # W_a (and b)
        self.score = nn.Linear(attention_dim, 1)  # w

    def project(self, features: Tensor) -> Tensor:
        """W_a a_i + b for every location, once per batch: (B, L, D) -> (B, L, A)."""
        return self.feature_proj(features)

    def forward(self, projected: Tensor, h_att: Tensor, beams: int = 1) -> Tensor:
        """Attention weights alpha_t (Eq. 5).

        projected: (B, L, A) from :meth:`project`; h_att: (B * beams, A) = W_h h_{t-1}, where
        rows k * beams ... (k + 1) * beams - 1 belong to image k. Returns alpha: (B * beams, L),
        rows summing to one.
        """
        B, L, A = projected.shape
        hidden = (2 * h_att).view(B, beams, 1, A)
        w2 = 2 * self.score.weight.view(A)  # (A,)
        shift = self.score.bias - self.score.weight.sum()  # b_w - sum(w): tanh = 2 sigmoid(2y) - 1
        if torch.is_grad_enabled():
            y2 = torch.add(hidden, projected.unsqueeze(1), alpha=2)  # 2y: (B, K, L, A)
            e = torch.matmul(torch.sigmoid(y2), w2)  # (B, K, L)
        else:
            e = self._scores_no_grad(projected, hidden, w2)
        return torch.softmax((e + shift).view(B * beams, L), dim=-1)

    def _scores_no_grad(self, projected: Tensor, hidden: Tensor, w2: Tensor) -> Tensor:
        """(2w)^T sigmoid(2y) without autograd: in place, and on the CPU a few images at a time.

        Each chunk's (images, K, L, A) tensor stays small enough to be reused by the allocator (and
        to stay in cache) instead of being mapped afresh from the system at every step.
        """
        B, L, A = projected.shape
        beams = hidden.size(1)
        w2 = w2.to(torch.promote_types(projected.dtype, hidden.dtype))  # bf16 under autocast
        chunk = max(1, CPU_CHUNK_ELEMENTS // (beams * L * A)) if projected.device.type == "cpu" else B
        e = projected.new_empty(B, beams, L)
        for i in range(0, B, chunk):
            y2 = torch.add(hidden[i : i + chunk], projected[i : i + chunk].unsqueeze(1), alpha=2)
            torch.matmul(y2.sigmoid_(), w2, out=e[i : i + chunk])
        return e


@dataclass
class Glimpse:
    """What one attention step gives the decoder."""

    context: Tensor  # (B, D): z_t before the gate beta_t
    alpha: Tensor  # (B, L): the attention weights
    location: Tensor  # (B,): the chosen location (argmax of alpha where nothing was sampled)
    log_prob: Optional[Tensor] = None  # (B,): log p(s_t | a) of a sampled location, 0 where the expected context was used
    entropy: Optional[Tensor] = None  # (B,): H[alpha_t]


def expected_context(alpha: Tensor, features: Tensor, beams: int = 1) -> Tensor:
    """sum_i alpha_ti a_i (Eq. 13): (B * beams, L), (B, L, D) -> (B * beams, D).

    The ``beams`` rows of an image share its features: one (beams, L) x (L, D) product per image.
    """
    B, L, D = features.shape
    return torch.bmm(alpha.view(B, beams, L), features).view(B * beams, D)


def location_context(location: Tensor, features: Tensor, beams: int = 1) -> Tensor:
    """a_{s_t}: the annotation vector at each row's location, (B * beams,), (B, L, D) -> (B * beams, D)."""
    image = torch.arange(location.size(0), device=location.device) // beams
    return features[image, location]


def glimpse(
    alpha: Tensor,
    features: Tensor,
    mode: str = "expected",
    use_expected: Optional[Tensor] = None,
    generator: Optional[torch.Generator] = None,
    location: Optional[Tensor] = None,
    beams: int = 1,
    temperature: float = 1.0,
) -> Glimpse:
    """Turn alpha_t into a context vector.

    mode "expected" is soft attention; "argmax" and "sample" are hard attention. In "sample"
    mode, rows where ``use_expected`` (B,) is true take the expected context instead of a
    sample: the paper's variance reduction (Section 4.1), whose draw the caller makes. A given
    ``location`` (B,) replaces the sample (to score a chosen location sequence exactly).
    With ``beams`` > 1, alpha has ``beams`` rows per image of ``features`` (beam search).

    mode "gumbel" (training only; NOT the paper's estimator) draws the location by straight-through
    Gumbel-softmax at ``temperature``: the forward pass reads the one sampled location (a one-hot
    weight vector), the backward pass differentiates softmax((log alpha + g) / temperature).
    """
    if mode == "expected":
        location = alpha.argmax(dim=-1)
        return Glimpse(expected_context(alpha, features, beams), alpha, location)
    if mode == "argmax":
        location = alpha.argmax(dim=-1)
        return Glimpse(location_context(location, features, beams), alpha, location)
    if mode == "gumbel":
        return _gumbel_glimpse(alpha, features, use_expected, generator, beams, temperature)
    if mode != "sample":
        raise ValueError(f"unknown attention mode {mode!r}; expected one of {ATTENTION_MODES}")
    if location is None:
        location = torch.multinomial(alpha.detach().float(), 1, generator=generator).squeeze(-1)  # s_t ~ Cat(alpha_t), (B,)
    log_alpha = torch.log(alpha.clamp_min(1e-12))
    log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)  # log p(s_t | a), (B,)
    entropy = -(alpha * log_alpha).sum(-1)  # H[alpha_t], (B,)
    context = location_context(location, features, beams)
    if use_expected is not None:
        context = torch.where(use_expected.unsqueeze(1), expected_context(alpha, features, beams), context)
        log_prob = log_prob.masked_fill(use_expected, 0.0)
    return Glimpse(context, alpha, location, log_prob, entropy)


def _gumbel_glimpse(alpha: Tensor, features: Tensor, use_expected: Optional[Tensor], generator: Optional[torch.Generator],
                    beams: int, temperature: float) -> Glimpse:
    """Straight-through Gumbel-softmax (Jang et al. 2017): one location forward, a relaxed gradient backward."""
    log_alpha = torch.log(alpha.clamp_min(1e-12))  # (B, L)
    u = torch.rand(alpha.shape, device=alpha.device, dtype=torch.float32, generator=generator)
    gumbel = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))  # (B, L)
    soft = torch.softmax((log_alpha + gumbel.to(log_alpha.dtype)) / temperature, dim=-1)  # (B, L)
    location = soft.detach().argmax(dim=-1)  # (B,): s_t ~ Cat(alpha_t)
    hard = torch.zeros_like(soft).scatter_(1, location.unsqueeze(1), 1.0)
    weights = hard + (soft - soft.detach())  # forward: the one-hot; backward: d soft
    context = expected_context(weights, features, beams)  # = a_{s_t} forward
    log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)
    entropy = -(alpha * log_alpha).sum(-1)
    if use_expected is not None:
        context = torch.where(use_expected.unsqueeze(1), expected_context(alpha, features, beams), context)
        log_prob = log_prob.masked_fill(use_expected, 0.0)
    return Glimpse(context, alpha, location, log_prob, entropy)
