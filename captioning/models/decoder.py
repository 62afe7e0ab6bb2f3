"""The Show, Attend and Tell decoder: an LSTM that attends over annotation vectors (paper Section 3.1.2).

One time step t, given the previous word y_{t-1}, the state (h_{t-1}, c_{t-1}) and the annotation
vectors a (B, L, D):

    alpha_t = f_att(a, h_{t-1})                              Eq. 4-5 (attention.py)
    z_t     = beta_t * phi(a, alpha_t),  beta_t = sigmoid(f_beta(h_{t-1}))   Section 4.2.1: ONE scalar per step
    i,f,o,g = W [E y_{t-1}; h_{t-1}; z_t] + b                Eq. 1
    c_t     = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)      Eq. 2-3
    p(y_t)  = softmax(L_o(E y_{t-1} + L_h h_t + L_z z_t))    Eq. 7, the deep output layer

with h_0 = f_init,h(mean_i a_i), c_0 = f_init,c(mean_i a_i) (tanh layers). Dropout follows the
authors' code: on the input of the initialisation layers, on h_t before the output layer and on
the deep output.

Nothing per step is done that can be done once: the image-side attention projection W_a a and the
embedding part of the LSTM input are computed for all steps before the loop; the three products of
h_{t-1} (attention, gate, LSTM) are one matrix product; only the captions still running take part
in a step (the batch is sorted by length); the output layer runs once, after the loop, over the
real (non-padded) steps only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.models.attention import CONTEXT_MODES, AdditiveAttention, Glimpse, glimpse


@dataclass
class DecoderOutput:
    """A teacher-forced pass over a batch of captions of T + 1 tokens (T decoding steps)."""

    logits: Tensor  # (N, V): one row per real step, in the order of mask.nonzero()
    mask: Tensor  # (B, T) bool: real (non-padded) steps
    alphas: Tensor  # (B, T, L): attention weights, zero at padded steps
    betas: Tensor  # (B, T): the gate scalar beta_t
    locations: Tensor  # (B, T): chosen (hard) or argmax (soft) location
    location_log_probs: Optional[Tensor] = None  # (B, T): log p(s_t | a), hard attention with sampling
    entropies: Optional[Tensor] = None  # (B, T): H[alpha_t], hard attention with sampling


@dataclass
class DecoderState:
    """The recurrent state of a batch of N rows (images, or images x beams) during generation."""

    h: Tensor  # (N, H)
    c: Tensor  # (N, H)
    features: Tensor  # (N, L, D)
    projected: Tensor  # (N, L, A): W_a a, computed once

    def select(self, index: Tensor) -> "DecoderState":
        """Rows ``index`` (a slice, or (N',) indices to reorder beams) of every tensor."""
        return DecoderState(self.h[index], self.c[index], self.features[index], self.projected[index])


class ShowAttendTellDecoder(nn.Module):
    """Attention LSTM decoder with soft or hard attention.

    Args:
        vocab_size: V. feature_dim: D of the annotation vectors. embed_dim: M. hidden_dim: H.
        attention_dim: A. dropout: the authors' 0.5. prev2out / ctx2out: add E y_{t-1} / L_z z_t
        inside the deep output layer (Eq. 7; both on in the paper). attention: "soft" or "hard".
    """

    def __init__(
        self,
        vocab_size: int,
        feature_dim: int,
        embed_dim: int = 512,
        hidden_dim: int = 512,
        attention_dim: int = 512,
        dropout: float = 0.5,
        attention: str = "soft",
        prev2out: bool = True,
        ctx2out: bool = True,
        pad_id: int = 0,
    ):
        super().__init__()
        if attention not in ("soft", "hard"):
            raise ValueError(f"attention must be 'soft' or 'hard', got {attention!r}")
        self.attention_kind = attention
        self.vocab_size, self.hidden_dim, self.attention_dim = vocab_size, hidden_dim, attention_dim
        self.prev2out, self.ctx2out = prev2out, ctx2out
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)  # E
        self.init_state = nn.Linear(feature_dim, 2 * hidden_dim)  # f_init,h and f_init,c side by side
        self.attention = AdditiveAttention(feature_dim, attention_dim)
        # Every product of h_{t-1} in one matrix: [W_h (A) | f_beta (1) | LSTM recurrent weights (4H)].
        self.hidden_proj = nn.Linear(hidden_dim, attention_dim + 1 + 4 * hidden_dim)
        self.embed_gates = nn.Linear(embed_dim, 4 * hidden_dim, bias=False)  # LSTM input weights for E y_{t-1}
        self.context_gates = nn.Linear(feature_dim, 4 * hidden_dim, bias=False)  # LSTM input weights for z_t
        self.out_hidden = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_context = nn.Linear(feature_dim, embed_dim) if ctx2out else None  # L_z
        self.out_logits = nn.Linear(embed_dim, vocab_size)  # L_o
        self.dropout = nn.Dropout(dropout)

    # ------------------------------------------------------------------ building blocks
    def initial_state(self, features: Tensor) -> DecoderState:
        """h_0, c_0 from the mean annotation vector; W_a a once. features: (B, L, D)."""
        h0, c0 = torch.tanh(self.init_state(self.dropout(features.mean(1)))).chunk(2, dim=-1)  # (B, D) -> 2 x (B, H)
        return DecoderState(h0, c0, features, self.attention.project(features))

    def _recur(
        self,
        x_gates: Tensor,
        state: DecoderState,
        mode: str,
        use_expected: Optional[Tensor] = None,
        location: Optional[Tensor] = None,
    ) -> tuple[Tensor, Tensor, Tensor, Glimpse, Tensor]:
        """One LSTM step with attention. x_gates: (N, 4H), the embedding's share of the gates.

        Returns h_t, c_t, z_t (gated context, (N, D)), the glimpse and beta_t (N,).
        """
        A = self.attention_dim
        hp = self.hidden_proj(state.h)  # (N, H) -> (N, A + 1 + 4H)
        alpha = self.attention(state.projected, hp[:, :A])  # (N, L)
        g = glimpse(alpha, state.features, mode, use_expected, location=location)
        beta = torch.sigmoid(hp[:, A])  # (N,): the gating scalar
        z = beta.unsqueeze(1) * g.context  # (N, D)
        gates = x_gates + hp[:, A + 1 :] + self.context_gates(z)  # (N, 4H)
        i, f, gg, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * state.c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c, z, g, beta

    def deep_output(self, embedded: Tensor, h: Tensor, z: Tensor) -> Tensor:
        """Eq. 7: L_o(tanh(E y_{t-1} + L_h h_t + L_z z_t)) with dropout: (N, M), (N, H), (N, D) -> (N, V)."""
        x = self.out_hidden(self.dropout(h))
        if self.prev2out:
            x = x + embedded
        if self.out_context is not None:
            x = x + self.out_context(z)
        return self.out_logits(self.dropout(torch.tanh(x)))

    def _mode(self, mode: Optional[str]) -> str:
        if self.attention_kind == "soft":
            return "expected"
        mode = mode or "expected"
        if mode not in CONTEXT_MODES:
            raise ValueError(f"unknown attention mode {mode!r}; expected one of {CONTEXT_MODES}")
        return mode

    # ------------------------------------------------------------------ teacher forcing
    def forward(
        self,
        features: Tensor,
        captions: Tensor,
        lengths: Tensor,
        mode: Optional[str] = None,
        use_expected: Optional[Tensor] = None,
        locations: Optional[Tensor] = None,
    ) -> DecoderOutput:
        """A teacher-forced pass.

        features: (B, L, D); captions: (B, T + 1) as [BOS, w_1, ..., EOS, PAD...];
        lengths: (B,) tokens per caption including BOS and EOS. Step t reads captions[:, t] and
        predicts captions[:, t + 1]. mode: for hard attention "sample" (training), "expected" or
        "argmax"; use_expected (B,) bool marks rows that take the expected context while sampling;
        ``locations`` (B, T) replaces the samples by given locations (to enumerate them exactly).
        """
        mode = self._mode(mode)
        B, L, _ = features.shape
        T = captions.size(1) - 1
        steps = (lengths - 1).clamp(min=0, max=T)  # (B,) decoding steps per caption
        # Sort by length so that the captions still running at step t are the first n_t rows.
        steps_sorted, order = steps.sort(descending=True)
        active = [int(n) for n in (steps_sorted.unsqueeze(0) > torch.arange(T, device=steps.device).unsqueeze(1)).sum(1).tolist()]  # n_t: one host sync per batch
        features, captions = features[order], captions[order]
        if use_expected is not None:
            use_expected = use_expected[order]
        forced = None if locations is None else locations[order]

        embedded = self.embedding(captions[:, :-1])  # (B, T, M), all steps at once
        x_gates = self.embed_gates(embedded)  # (B, T, 4H)
        state = self.initial_state(features)

        H, D = self.hidden_dim, features.size(-1)
        hs = features.new_zeros(B, T, H)
        zs = features.new_zeros(B, T, D)
        alphas = features.new_zeros(B, T, L)
        betas = features.new_zeros(B, T)
        locations = captions.new_zeros(B, T)
        sampling = mode == "sample"
        log_probs = features.new_zeros(B, T) if sampling else None
        entropies = features.new_zeros(B, T) if sampling else None
        for t, n in enumerate(active):
            if n == 0:
                break
            if n < state.h.size(0):
                state = state.select(slice(0, n))
            h, c, z, g, beta = self._recur(
                x_gates[:n, t], state, mode,
                None if use_expected is None else use_expected[:n],
                None if forced is None else forced[:n, t],
            )
            state = DecoderState(h, c, state.features, state.projected)
            hs[:n, t], zs[:n, t], alphas[:n, t], betas[:n, t], locations[:n, t] = h, z, g.alpha, beta, g.location
            if sampling:
                log_probs[:n, t], entropies[:n, t] = g.log_prob, g.entropy

        # Back to the caller's order, then the output layer once over the real steps.
        unsort = order.argsort()
        hs, zs, alphas, betas, locations = hs[unsort], zs[unsort], alphas[unsort], betas[unsort], locations[unsort]
        embedded = embedded[unsort]
        mask = torch.arange(T, device=steps.device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T)
        logits = self.deep_output(embedded[mask], hs[mask], zs[mask])  # (N, V)
        return DecoderOutput(
            logits=logits,
            mask=mask,
            alphas=alphas,
            betas=betas,
            locations=locations,
            location_log_probs=log_probs[unsort] if sampling else None,
            entropies=entropies[unsort] if sampling else None,
        )

    # ------------------------------------------------------------------ generation
    def step(self, tokens: Tensor, state: DecoderState, mode: Optional[str] = None) -> tuple[Tensor, DecoderState, Glimpse]:
        """One generation step: previous tokens (N,) -> log p(y_t) (N, V), the new state, the glimpse."""
        embedded = self.embedding(tokens)  # (N, M)
        h, c, z, g, _ = self._recur(self.embed_gates(embedded), state, self._mode(mode))
        logits = self.deep_output(embedded, h, z)
        return F.log_softmax(logits.float(), dim=-1), DecoderState(h, c, state.features, state.projected), g
