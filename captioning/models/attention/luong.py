"""Luong et al. 2015's placement (without input feeding), ``placement: luong``:

    i, f, g, o = T [E y_{t-1}; h_{t-1}]                the LSTM first, without the context
    alpha_t, z_t from h_t                              (the paper's: from h_{t-1})
    h~_t = tanh(W_c [z_t; h_t])                        the attentional state, in h_t's place in Eq. 7

Attention no longer feeds the recurrence, so the fast path (captioning/fast/) runs the LSTM over
every step at once and attends for all steps in batched products.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from captioning.models.decoder import PLACEMENTS, ShowAttendTellDecoder, lstm_cell


@PLACEMENTS.register("luong")
class LuongDecoder(ShowAttendTellDecoder):
    reads_context = False  # T reads [E y_{t-1}; h_{t-1}]

    def __init__(self, vocab_size: int, feature_dim: int, config=None):
        super().__init__(vocab_size, feature_dim, config)
        self.W_c = nn.Linear(feature_dim + self.hidden_dim, self.hidden_dim)

    def recur(self, Ey: Tensor, state, mode: str, use_expected=None, location=None, temperature=1.0):
        h, c = lstm_cell(self.T(torch.cat([Ey, state.h], -1)), state.c)
        g, beta, z = self.attend(h, state, mode, use_expected, location, temperature)
        return h, c, z, beta, g

    def deep_output(self, Ey: Tensor, h: Tensor, z: Tensor) -> Tensor:
        return super().deep_output(Ey, self.attentional_state(h, z), z)

    def attentional_state(self, h: Tensor, z: Tensor) -> Tensor:
        """h~_t = tanh(W_c [z_t; h_t])."""
        return torch.tanh(self.W_c(torch.cat([z, h], -1)))
