"""Attention-over-attention (Cui et al. 2017) in the captioning decoder, ``over_attention: true``.
The "document" is the L locations, the "query" the decoder states so far, h_0 ... h_{t-1} (one
per word read; h_{t-1}, the state Eq. 4 attends from, last):

    M_ij     = score(a_i, h_j)                  (L x t) the matching matrix: Eq. 4's e for each state
    alpha_j  = normalise over i of M_ij         column-wise: one attention over the locations per state
    beta_i   = normalise over j of M_ij         row-wise: one attention over the states per location
    beta_bar = mean_i beta_i                    (t,) how much each state so far counts
    alpha_t  = sum_j beta_bar_j alpha_j         (L,) the final attention, Cui's s = alpha beta_bar

With ``score: dot`` or ``general``, M = K Q^T is Cui's dot-product matching (K the keys a_i or
W_a a_i, Q the states themselves); the other scores generalise it. This is NOT Huang et al.'s
Attention on Attention (``aoa``: the context times a sigmoid gate).

A row of M depends only on the image and its state h_j, neither of which changes once h_j is made.
So each state is scored once, at the step that attends from it, and its row is kept. The state
carries M's rows so far (``scores``): max_steps + 1 slots in the search loops, reordered with the
beams by :class:`OverAttentionStates`, and one more slot a step in teacher forcing. A step costs
the paper's one score of h_{t-1} plus the two normalisations of M (L x t numbers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from captioning.errors import ConfigError
from captioning.models.decoder import DecoderState, DecoderStates, ShowAttendTellDecoder, glimpse, per_row


def _plain(state: DecoderState) -> dict:
    """The fields of :class:`DecoderState` of ``state``, by name."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(DecoderState)}


@dataclass
class OverAttentionState(DecoderState):
    """The LSTM's state and the rows of M scored so far."""

    scores: Tensor | None = None  # (N, S, L) or (N, S, heads, L): score(a, h_j) in slot j for j < t
    grows: bool = False  # teacher forcing's: one slot appended a step (no max_steps given)
    #: set by ``matching``: ``scores`` with h_t's row in slot t, the next state's ``scores``
    matched: Tensor | None = None

    def select(self, index) -> OverAttentionState:
        return OverAttentionState(**_plain(super().select(index)), scores=self.scores[index], grows=self.grows)

    def with_recurrent(self, h: Tensor, c: Tensor) -> OverAttentionState:
        """The next state keeps the rows this step scored (``matching`` ran: the step attended)."""
        if self.matched is None:
            raise RuntimeError("OverAttentionState.with_recurrent: the step did not attend (no row of M scored)")
        return OverAttentionState(
            h, c, self.features, self.projected, self.beams, self.bias, self.t + 1, self.matched, self.grows
        )

    def expand_beams(self, beams: int) -> OverAttentionState:
        rows = _plain(super().expand_beams(beams))
        return OverAttentionState(**rows, scores=self.scores.repeat_interleave(beams, 0), grows=self.grows)


class OverAttentionStates(DecoderStates):
    """The search loops' view: (h, c, t, scores) carried and reordered with the beams."""

    n_carried = 4

    @staticmethod
    def carried(state: OverAttentionState) -> list[Tensor]:
        return [state.h, state.c, state.t, state.scores]

    @staticmethod
    def state(carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> OverAttentionState:
        h, c, t, scores = carried
        return OverAttentionState(h, c, *constants, beams, t=t, scores=scores)


class OverAttentionDecoder(ShowAttendTellDecoder):
    """The paper's decoder whose alpha_t is the attention over the attentions of its states so far."""

    state_layout = OverAttentionStates

    def __init__(self, vocab_size: int, feature_dim: int, config=None):
        super().__init__(vocab_size, feature_dim, config)
        if self.config.window != "global":
            raise ConfigError(
                f"model.decoder.over_attention: attends over the whole grid; window {self.config.window!r} "
                "cannot be combined with it (use window global)"
            )

    def initial_state(self, features: Tensor, max_steps: int | None = None) -> OverAttentionState:
        """The paper's initial state and no row of M yet: max_steps + 1 empty slots, or none."""
        state = super().initial_state(features, max_steps)
        N, L, heads = state.h.size(0), features.size(1), self.f_att.heads
        row = (L,) if heads == 1 else (heads, L)
        scores = state.h.new_zeros(N, 0 if max_steps is None else max_steps + 1, *row)
        return OverAttentionState(**_plain(state), scores=scores, grows=max_steps is None)

    def matching(self, state: OverAttentionState) -> Tensor:
        """M^T: the score of every location for every state so far, (N, S, L) or (N, S, heads, L).
        Scores the state attended from (state.h) into slot t, t the steps taken; the older rows are
        the state's own. Sets ``state.matched`` (the rows without the focus prior) for the next state."""
        e = self.f_att(state.projected, state.h, state.beams)  # (N, L) or (N, heads, L): Eq. 4's e
        new = e.unsqueeze(1).to(state.scores.dtype)
        if state.grows:
            rows = torch.cat([state.scores, new], 1)
        else:  # slot t, compared on the device: nothing read back, graph-safe
            slot = torch.arange(state.scores.size(1), device=e.device) == state.t.unsqueeze(1)  # (N, S)
            rows = torch.where(slot.view(*slot.shape, *[1] * (e.dim() - 1)), new, state.scores)
        state.matched = rows
        if state.bias is not None:  # a prior over the locations, per image
            rows = rows + per_row(state.bias, state.beams).view(rows.size(0), *[1] * (rows.dim() - 2), -1)
        return rows

    def over_attention(self, M: Tensor, t: Tensor) -> Tensor:
        """alpha_t (N, L) or (N, heads, L) from M^T (N, S, ..., L) and the steps taken t (N,)."""
        N, S = M.shape[:2]
        alpha = self.normalizer(M)  # column-wise: over the locations, for each state
        words = M.movedim(1, -1)  # (N, ..., L, S)
        so_far = (torch.arange(S, device=M.device) <= t.unsqueeze(1)).view(N, *[1] * (words.dim() - 2), S)
        beta = self.normalizer(words.masked_fill(~so_far, float("-inf")))  # row-wise: over the states so far
        beta_bar = beta.mean(-2)  # (N, ..., S): the mean over the locations
        return (alpha.movedim(1, -1) * beta_bar.unsqueeze(-2)).sum(-1)

    def attend(self, h: Tensor, state: OverAttentionState, mode: str, use_expected=None, location=None,
               temperature=1.0):  # fmt: skip
        """As the paper's ``attend``, with alpha_t the attention over attention (h is state.h, the last state)."""
        alpha = self.over_attention(self.matching(state), state.t)
        if self.multi_head is None:
            g = glimpse(alpha, state.features, mode, use_expected, location, state.beams, temperature)
        else:
            g = self.multi_head(alpha, state.features, mode, use_expected, location, state.beams, temperature)
        context = g.context if self.aoa is None else self.aoa(g.context, h)
        beta = torch.sigmoid(self.f_beta(h))  # (N, 1): the gating scalar
        g.views.update(gate=beta.squeeze(-1))
        return g, beta.squeeze(-1), beta * context
