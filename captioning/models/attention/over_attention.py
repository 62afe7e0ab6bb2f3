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
Attention on Attention (``aoa``: the context times a sigmoid gate). The state keeps the states so
far (``history``): max_steps + 1 slots in the search loops, reordered with the beams by
:class:`OverAttentionStates`, and one more slot a step in teacher forcing. Each step scores every
state so far: t times the attention's cost (one batched product for the dot-product scores).
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
    """The LSTM's state and the states so far."""

    history: Tensor | None = None  # (N, S, H): h_j in slot j for j <= t; later slots unused
    grows: bool = False  # teacher forcing's: one slot appended a step (no max_steps given)

    def select(self, index) -> OverAttentionState:
        return OverAttentionState(**_plain(super().select(index)), history=self.history[index], grows=self.grows)

    def with_recurrent(self, h: Tensor, c: Tensor) -> OverAttentionState:
        """h_t written in slot t (compared with t on the device: nothing read back, graph-safe)."""
        t, new = self.t + 1, h.unsqueeze(1).to(self.history.dtype)
        if self.grows:
            history = torch.cat([self.history, new], 1)
        else:
            slot = torch.arange(self.history.size(1), device=h.device) == t.unsqueeze(1)  # (N, S)
            history = torch.where(slot.unsqueeze(-1), new, self.history)
        return OverAttentionState(h, c, self.features, self.projected, self.beams, self.bias, t, history, self.grows)

    def expand_beams(self, beams: int) -> OverAttentionState:
        rows = _plain(super().expand_beams(beams))
        return OverAttentionState(**rows, history=self.history.repeat_interleave(beams, 0), grows=self.grows)


class OverAttentionStates(DecoderStates):
    """The search loops' view: (h, c, t, history) carried and reordered with the beams."""

    n_carried = 4

    @staticmethod
    def carried(state: OverAttentionState) -> list[Tensor]:
        return [state.h, state.c, state.t, state.history]

    @staticmethod
    def state(carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> OverAttentionState:
        h, c, t, history = carried
        return OverAttentionState(h, c, *constants, beams, t=t, history=history)


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
        """The paper's initial state and h_0 in the history's slot 0, of max_steps + 1 slots."""
        state = super().initial_state(features, max_steps)
        empty = state.h.new_zeros(state.h.size(0), 0 if max_steps is None else max_steps, state.h.size(1))
        history = torch.cat([state.h.unsqueeze(1), empty], 1)
        return OverAttentionState(**_plain(state), history=history, grows=max_steps is None)

    def matching(self, state: OverAttentionState) -> Tensor:
        """M^T: the score of every location for every state so far, (N, S, L) or (N, S, heads, L)."""
        N, S, H = state.history.shape
        e = self.f_att(state.projected, state.history.reshape(N * S, H), state.beams * S)
        e = e.view(N, S, *e.shape[1:])
        if state.bias is not None:  # a prior over the locations, per image
            e = e + per_row(state.bias, state.beams).view(N, *[1] * (e.dim() - 2), -1)
        return e

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
