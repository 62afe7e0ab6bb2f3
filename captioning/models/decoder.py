"""The Show, Attend and Tell decoder: an LSTM that attends over annotation vectors (paper Section 3.1.2).

One time step t, given the previous word y_{t-1}, the state (h_{t-1}, c_{t-1}) and the annotation
vectors a (B, L, D):

    alpha_t = f_att(a, h_{t-1})                              Eq. 4-5 (attention.py)
    z_t     = beta_t * phi(a, alpha_t),  beta_t = sigmoid(f_beta(h_{t-1}))   Section 4.2.1: ONE scalar per step
    i,f,g,o = W [E y_{t-1}; h_{t-1}; z_t] + b                Eq. 1 (the gates, in this order in the code)
    c_t     = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)      Eq. 2-3
    p(y_t)  = softmax(L_o(tanh(E y_{t-1} + L_h h_t + L_z z_t)))   Eq. 7, the deep output layer

with h_0 = f_init,h(mean_i a_i), c_0 = f_init,c(mean_i a_i) (tanh layers). The tanh inside Eq. 7
and the dropout follow the authors' code, not the paper's text: dropout on the input of the
initialisation layers, on h_t before the output layer and on the deep output.

Nothing per step is done that can be done once: the image-side attention projection W_a a and the
embedding part of the LSTM input are computed for all steps before the loop; the three products of
h_{t-1} (attention, gate, LSTM) are one matrix product; only the captions still running take part
in a step (the batch is sorted by length); the output layer runs once, after the loop, over the
real (non-padded) steps only.

The attention variants (docs/ARCHITECTURE.md; the paper's model is every default):

- ``score`` and ``heads``: the score function and multi-head attention (attention.py); with
  several heads the heads' contexts are joined and projected to D, z_t = beta_t W_o [z_t^1; ...; z_t^k].
- ``placement``: ``bahdanau`` attends from h_{t-1} before the LSTM (the paper); ``luong`` attends
  from h_t after it (Luong et al. 2015, without input feeding): the LSTM reads E y_{t-1} only,
  alpha_t = f_att(a, h_t), z_t = beta_t phi(a, alpha_t) with beta_t = sigmoid(f_beta(h_t)), the
  attentional state h~_t = tanh(W_c [z_t; h_t]) takes h_t's place in the deep output. Attention no
  longer feeds the recurrence, so the teacher-forced pass runs the LSTM over all steps in one call
  (nn.LSTM, cuDNN/fused) and attends for all steps in one batched product.
- ``window``: ``global`` (every location) or ``local`` (Luong's local-p on the 2-D grid: a
  predicted centre and a Gaussian window of ``local_sigma`` cells, the alignment renormalised).
- ``refiner_layers``: Transformer encoder layers (self-attention) over the L annotation vectors,
  with 2-D sinusoidal position embeddings, applied once per batch before decoding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.viz.attention_maps import grid_shape
from captioning.models.attention import (ATTENTION_MODES, SCORES, Glimpse, LocalCentre, build_attention, glimpse,
                                         graph_safe_sampling, window_log)
from captioning.models.deferred import deferred_linear
from captioning.vocab import Vocabulary

#: attention modes of a teacher-forced training pass only: "gumbel", straight-through Gumbel-softmax
#: (an alternative to REINFORCE, not the paper's estimator; see objectives/reinforce.py)
TRAINING_MODES = ("gumbel",)


@dataclass
class DecoderConfig:
    """The attention LSTM decoder (sizes as in the paper's notation).

    Args:
        embed_dim: M, the word embedding.
        hidden_dim: H, the LSTM state.
        attention_dim: A, the attention network's hidden layer.
        dropout: dropout probability where the authors' code puts it (0.5 in the paper's runs).
        attention_kind: "soft" (deterministic, Eq. 13) or "hard" (stochastic, Eq. 8-12, trained with REINFORCE).
        prev2out: add the previous word's embedding E y_{t-1} inside the deep output layer (Eq. 7).
        ctx2out: add the context L_z z_t inside the deep output layer (Eq. 7).
        compile_step: ``torch.compile`` the time step that training and decoding repeat (dynamic
            shapes; compiles on first use; tools/benchmark.py --compile measures what it gains).
        score: the attention score function: "additive" (the paper's, Eq. 4), "dot", "general"
            or "scaled_dot" (see models/attention.py).
        heads: attention heads (1: the paper's single alpha per step).
        placement: "bahdanau" (attend from h_{t-1} before the LSTM, the paper) or "luong" (from
            h_t after it, with the attentional state tanh(W_c [z_t; h_t]) in the deep output).
        window: "global" attention over every location, or "local" (a predicted centre and a
            2-D Gaussian window over the grid).
        local_sigma: the local window's standard deviation, in grid cells.
        refiner_layers: Transformer encoder layers over the annotation vectors before decoding (0: none).
        refiner_heads: attention heads of those layers.
    """

    embed_dim: int = 512
    hidden_dim: int = 512
    attention_dim: int = 512
    dropout: float = 0.5
    attention_kind: Literal["soft", "hard"] = "soft"
    prev2out: bool = True
    ctx2out: bool = True
    compile_step: bool = False
    score: Literal["additive", "dot", "general", "scaled_dot"] = "additive"
    heads: int = 1
    placement: Literal["bahdanau", "luong"] = "bahdanau"
    window: Literal["global", "local"] = "global"
    local_sigma: float = 1.5
    refiner_layers: int = 0
    refiner_heads: int = 4

    def __post_init__(self):
        if self.attention_kind not in ("soft", "hard"):
            raise ConfigError(f"model.decoder.attention_kind: expected 'soft' or 'hard', got {self.attention_kind!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.decoder.dropout: expected a probability in [0, 1), got {self.dropout!r}")
        for field in ("embed_dim", "hidden_dim", "attention_dim", "heads", "refiner_heads"):
            if getattr(self, field) < 1:
                raise ConfigError(f"model.decoder.{field}: expected an integer >= 1, got {getattr(self, field)!r}")
        for field, choices in (("score", SCORES), ("placement", ("bahdanau", "luong")), ("window", ("global", "local"))):
            if getattr(self, field) not in choices:
                raise ConfigError(f"model.decoder.{field}: expected one of {', '.join(choices)}, got {getattr(self, field)!r}")
        if not self.local_sigma > 0:
            raise ConfigError(f"model.decoder.local_sigma: expected a number > 0 (grid cells), got {self.local_sigma!r}")
        if self.refiner_layers < 0:
            raise ConfigError(f"model.decoder.refiner_layers: expected an integer >= 0, got {self.refiner_layers!r}")

    @property
    def variant(self) -> str:
        """A short name of the attention variant ("additive" for the paper's model)."""
        parts = [self.score] + ([f"{self.heads}heads"] if self.heads > 1 else []) + \
                (["luong"] if self.placement == "luong" else []) + (["local"] if self.window == "local" else []) + \
                ([f"refiner{self.refiner_layers}"] if self.refiner_layers else [])
        return "+".join(parts)


@dataclass
class DecoderOutput:
    """A teacher-forced pass over a batch of captions of T + 1 tokens (T decoding steps)."""

    logits: Tensor  # (N, V): one row per real step, in the order of mask.nonzero()
    mask: Tensor  # (B, T) bool: real (non-padded) steps
    alphas: Tensor  # (B, T, L): attention weights, zero at padded steps
    betas: Tensor  # (B, T): the gate scalar beta_t
    locations: Tensor  # (B, T): chosen (hard) or argmax (soft) location; (B, T, heads) for hard multi-head
    location_log_probs: Optional[Tensor] = None  # (B, T): log p(s_t | a), hard attention with sampling
    entropies: Optional[Tensor] = None  # (B, T): H[alpha_t], hard attention with sampling
    head_alphas: Optional[Tensor] = None  # (B, T, heads, L) with several heads (alphas is their mean)


@dataclass
class DecoderState:
    """The recurrent state of a batch of N rows (images, or images x beams) during generation."""

    h: Tensor  # (N, H)
    c: Tensor  # (N, H)
    features: Tensor  # (N / beams, L, D)
    projected: Tensor  # (N / beams, L, A): W_a a, computed once
    beams: int = 1  # rows per image: rows k * beams ... (k + 1) * beams - 1 share image k's features

    def select(self, index: Tensor) -> "DecoderState":
        """Rows ``index`` (a slice, or (N',) indices) of every tensor; one row per image only."""
        if self.beams != 1:
            raise ValueError("select() needs one row per image; beams share their image's features")
        return DecoderState(self.h[index], self.c[index], self.features[index], self.projected[index])

    def with_recurrent(self, h: Tensor, c: Tensor) -> "DecoderState":
        """The same images (features) with a new recurrent state."""
        return DecoderState(h, c, self.features, self.projected, self.beams)

    def expand_beams(self, beams: int) -> "DecoderState":
        """Each image's state copied to ``beams`` rows; the features stay one copy per image."""
        if self.beams != 1:
            raise ValueError("expand_beams() of a state that already has beams")
        return DecoderState(self.h.repeat_interleave(beams, 0), self.c.repeat_interleave(beams, 0),
                            self.features, self.projected, beams)


class ShowAttendTellDecoder(nn.Module):
    """Attention LSTM decoder with soft or hard attention over annotation vectors of width D
    (``feature_dim``), writing words of a vocabulary of V = ``vocab_size`` tokens."""

    def __init__(self, vocab_size: int, feature_dim: int, config: DecoderConfig = DecoderConfig()):
        super().__init__()
        embed_dim, hidden_dim, attention_dim = config.embed_dim, config.hidden_dim, config.attention_dim
        self.config = config
        self.attention_kind = config.attention_kind
        self.vocab_size, self.hidden_dim, self.attention_dim = vocab_size, hidden_dim, attention_dim
        self.prev2out = config.prev2out
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=Vocabulary.pad_id)  # E
        self.init_state = nn.Linear(feature_dim, 2 * hidden_dim)  # f_init,h and f_init,c side by side
        self.f_att = build_attention(config.score, feature_dim, hidden_dim, attention_dim, config.heads)
        self.heads, self.luong, self.local = config.heads, config.placement == "luong", config.window == "local"
        # The widths of what the decoder computes from h for attention: the query (W_h h; 0 where
        # the query is h itself), the gate f_beta (1), W_p h of the local window's centre (A or 0).
        self.attention_splits = [self.f_att.query_dim, 1, attention_dim if self.local else 0]
        if not self.luong:
            # Every product of h_{t-1} in one matrix: [W_h (A) | f_beta (1) | (W_p) | LSTM recurrent weights (4H)].
            self.from_hidden = nn.Linear(hidden_dim, sum(self.attention_splits) + 4 * hidden_dim)
            self.embed_gates = nn.Linear(embed_dim, 4 * hidden_dim, bias=False)  # LSTM input weights for E y_{t-1}
            self.context_gates = nn.Linear(feature_dim, 4 * hidden_dim, bias=False)  # LSTM input weights for z_t
        self.out_hidden = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_context = nn.Linear(feature_dim, embed_dim) if config.ctx2out else None  # L_z
        self.out_logits = nn.Linear(embed_dim, vocab_size)  # L_o
        self.dropout = nn.Dropout(config.dropout)
        # The variants' own layers (none for the paper's model, made after its layers so that its
        # initialisation draws the same numbers).
        if self.luong:
            self.lstm = nn.LSTM(embed_dim, hidden_dim, batch_first=True)  # reads E y_{t-1} only
            self.from_output = nn.Linear(hidden_dim, sum(self.attention_splits))  # [W_h | f_beta | (W_p)] of h_t
            self.combine = nn.Linear(feature_dim + hidden_dim, hidden_dim)  # W_c: h~_t = tanh(W_c [z_t; h_t])
        self.local_centre = LocalCentre(attention_dim) if self.local else None
        self.head_proj = nn.Linear(config.heads * feature_dim, feature_dim, bias=False) if config.heads > 1 else None  # W_o
        self.refiner = GridRefiner(feature_dim, config.refiner_layers, config.refiner_heads, config.dropout) \
            if config.refiner_layers else None
        #: run teacher forcing as the static-shape pass (every row at every step, no host
        #: synchronisation; see :meth:`static_forward`); set by the training module
        self.static_shapes = False
        if config.compile_step:
            # Shapes are marked dynamic: the number of running captions shrinks from step to step.
            self.recurrent_step = torch.compile(self.recurrent_step, dynamic=True)

    # ------------------------------------------------------------------ building blocks
    def initial_state(self, features: Tensor) -> DecoderState:
        """h_0, c_0 from the mean annotation vector; W_a a once (and the refiner). features: (B, L, D)."""
        if self.refiner is not None:
            features = self.refiner(features)
        h0, c0 = torch.tanh(self.init_state(self.dropout(features.mean(1)))).chunk(2, dim=-1)  # (B, D) -> 2 x (B, H)
        return DecoderState(h0, c0, features, self.f_att.project(features))

    def attend(self, state: DecoderState, from_h: Tensor, h: Tensor, mode: str, use_expected: Optional[Tensor] = None,
               location: Optional[Tensor] = None, beams: Optional[int] = None,
               temperature: float = 1.0) -> tuple[Glimpse, Tensor, Tensor]:
        """alpha_t, the glimpse and the gated context z_t from the attention share of the products of h.

        from_h: (N, query + 1 + local) = [W_h h | f_beta(h) | W_p h]; h: (N, H), the query of the
        dot and general scores. ``beams``: rows per image of ``state.features`` (default state.beams).
        Returns the glimpse, beta (N,) and z (N, D)."""
        beams = state.beams if beams is None else beams
        q, h_beta, w_p_h = from_h.split(self.attention_splits, dim=1)
        bias = None
        if self.local:
            gh, gw = grid_shape(state.features.size(1))
            bias = window_log(self.local_centre(w_p_h, gh, gw), gh, gw, self.config.local_sigma)  # (N, L)
        alpha = self.f_att(state.projected, q if self.f_att.query_dim else h, beams, bias=bias)  # (N, L) or (N, heads, L)
        g = glimpse(alpha, state.features, mode, use_expected, location=location, beams=beams, temperature=temperature)
        context = g.context if self.head_proj is None else self.head_proj(g.context)  # (N, D)
        beta = torch.sigmoid(h_beta.squeeze(1))  # (N,): the gating scalar
        return g, beta, beta.unsqueeze(1) * context

    def recurrent_step(
        self,
        x_gates: Tensor,
        state: DecoderState,
        mode: str,
        use_expected: Optional[Tensor] = None,
        location: Optional[Tensor] = None,
        layers: Optional[tuple] = None,
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor, Tensor, Glimpse, Tensor]:
        """One LSTM step with attention. x_gates: (N, 4H), the embedding's share of the gates.

        ``layers``: the (from_hidden, context_gates) products to use, by default the layers
        themselves (a training pass gives their deferred-gradient versions, see deferred.py).
        Returns h_t, c_t, z_t (gated context, (N, D)), the glimpse and beta_t (N,).
        """
        if self.luong:
            return self._luong_step(x_gates, state, mode, use_expected, location, temperature)
        A = self.attention_dim
        from_hidden, context_gates = layers or (self.from_hidden, self.context_gates)
        if self.attention_splits == [A, 1, 0] and self.heads == 1:  # the paper's model, as it always ran
            h_att, h_beta, h_gates = from_hidden(state.h).split([A, 1, 4 * self.hidden_dim], dim=1)  # (N, H) -> (N, A), (N, 1), (N, 4H)
            alpha = self.f_att(state.projected, h_att, state.beams)  # (N, L)
            g = glimpse(alpha, state.features, mode, use_expected, location=location, beams=state.beams,
                        temperature=temperature)
            beta = torch.sigmoid(h_beta.squeeze(1))  # (N,): the gating scalar
            z = beta.unsqueeze(1) * g.context  # (N, D)
        else:
            from_h, h_gates = from_hidden(state.h).split([sum(self.attention_splits), 4 * self.hidden_dim], dim=1)
            g, beta, z = self.attend(state, from_h, state.h, mode, use_expected, location, temperature=temperature)
        gates = x_gates + h_gates + context_gates(z)  # (N, 4H)
        i, f, gg, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * state.c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c, z, g, beta

    def _luong_step(self, x: Tensor, state: DecoderState, mode: str, use_expected: Optional[Tensor],
                    location: Optional[Tensor], temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor, Glimpse, Tensor]:
        """Luong placement, one step: the LSTM on E y_{t-1} (x: (N, M)), then attention from h_t.
        Returns h~_t (the attentional state, in h_t's place), c_t... as recurrent_step, and the new h_t
        is kept in the state by :meth:`step` (see there)."""
        lstm = self.lstm
        gates = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0) + F.linear(state.h, lstm.weight_hh_l0, lstm.bias_hh_l0)
        i, f, gg, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * state.c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        g, beta, z = self.attend(state, self.from_output(h), h, mode, use_expected, location, temperature=temperature)
        return h, c, z, g, beta

    def attentional_state(self, z: Tensor, h: Tensor) -> Tensor:
        """Luong's h~_t = tanh(W_c [z_t; h_t]): (N, D), (N, H) -> (N, H)."""
        return torch.tanh(self.combine(torch.cat([z, h], dim=-1)))

    def deep_output(self, embedded: Tensor, h: Tensor, z: Tensor) -> Tensor:
        """Eq. 7 as in the authors' code: L_o(tanh(E y_{t-1} + L_h h_t + L_z z_t)) with dropout: (N, M), (N, H), (N, D) -> (N, V)."""
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
        if mode not in ATTENTION_MODES + TRAINING_MODES:
            raise ValueError(f"unknown attention mode {mode!r}; expected one of {ATTENTION_MODES + TRAINING_MODES}")
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
        temperature: float = 1.0,
        static: bool = False,
    ) -> DecoderOutput:
        """A teacher-forced pass.

        features: (B, L, D); captions: (B, T + 1) as [BOS, w_1, ..., EOS, PAD...];
        lengths: (B,) tokens per caption including BOS and EOS. Step t reads captions[:, t] and
        predicts captions[:, t + 1]. mode: for hard attention "sample" (training), "expected" or
        "argmax"; use_expected (B,) bool marks rows that take the expected context while sampling;
        ``locations`` (B, T) replaces the samples by given locations (to enumerate them exactly).
        mode "gumbel" samples by straight-through Gumbel-softmax at ``temperature`` (training only).
        ``static``: the static-shape pass (:meth:`static_forward`; logits (B, T, V)).
        """
        mode = self._mode(mode)
        if static or self.static_shapes:
            return self.static_forward(features, captions, lengths, mode, use_expected, locations, temperature)
        if self.luong:
            return self._luong_forward(features, captions, lengths, mode, use_expected, locations, temperature)
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
        x_steps = self.embed_gates(embedded).unbind(1)  # T x (B, 4H): one backward op, not one per step
        state = self.initial_state(features)
        # The two products repeated at every step give their weights ONE gradient product each
        # (per step, autograd would make and add a whole weight-sized gradient from a few rows).
        layers = (deferred_linear(self.from_hidden), deferred_linear(self.context_gates))

        # Each step's outputs for its n_t running rows are kept as they come and put in place once
        # after the loop (writing them into (B, T, .) tensors step by step would, in the backward
        # pass, copy the whole tensor's gradient once per step).
        sampling = mode in ("sample", "gumbel")
        per_step = []
        for t, n in enumerate(active):
            if n == 0:
                break
            if n < state.h.size(0):
                state = state.select(slice(0, n))
            h, c, z, g, beta = self.recurrent_step(
                x_steps[t][:n], state, mode,
                None if use_expected is None else use_expected[:n],
                None if forced is None else forced[:n, t],
                layers, temperature,
            )
            state = state.with_recurrent(h, c)
            per_step.append((h, z, g.alpha, beta, g.location) + ((g.log_prob, g.entropy) if sampling else ())
                            + ((g.head_alpha,) if self.heads > 1 else ()))
        # step-major rows, (N, .) each: h, z, alpha, beta, location (and log p(s), entropy when
        # sampling; the heads' alphas with several heads)
        hs, zs, alphas, betas, locations, *rest = (torch.cat(column) for column in zip(*per_step))

        # Where each packed row belongs: (sorted row i, step t) -> the caller's row order[i], step t.
        device = steps.device
        counts = [n for n in active if n > 0]
        step_of = torch.repeat_interleave(torch.arange(len(counts), device=device), torch.tensor(counts, device=device))
        row_of = torch.cat([torch.arange(n, device=device) for n in counts])  # sorted row
        flat = order[row_of] * T + step_of  # (N,): index into the caller's (B, T) grid
        in_mask_order = flat.argsort()  # mask.nonzero() is row-major over the caller's (B, T)
        mask = torch.arange(T, device=device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T)

        def grid(values: Tensor) -> Tensor:  # (N, ...) packed -> (B, T, ...), zero at padded steps
            out = values.new_zeros((B * T,) + values.shape[1:])
            return out.index_copy(0, flat, values).view((B, T) + values.shape[1:])

        # The output layer once, over the real steps, in mask.nonzero() order.
        sorted_flat = (row_of * T + step_of)[in_mask_order]  # the same rows in the (sorted) embedded grid
        logits = self.deep_output(embedded.reshape(B * T, -1)[sorted_flat], hs[in_mask_order], zs[in_mask_order])  # (N, V)
        return self._output(logits, mask, grid, alphas, betas, locations, rest, sampling)

    def _output(self, logits: Tensor, mask: Tensor, place, alphas: Tensor, betas: Tensor, locations: Tensor,
                rest: list, sampling: bool) -> DecoderOutput:
        """The :class:`DecoderOutput` of a pass: its per-step columns (alpha, beta, location, then
        log p(s) and entropy when sampling, the heads' alphas with several heads) put in their
        (B, T, ...) place by ``place``, zero at padded steps."""
        return DecoderOutput(
            logits=logits,
            mask=mask,
            alphas=place(alphas),
            betas=place(betas),
            locations=place(locations),
            location_log_probs=place(rest[0]) if sampling else None,
            entropies=place(rest[1]) if sampling else None,
            head_alphas=place(rest[-1]) if self.heads > 1 else None,
        )

    def static_forward(self, features: Tensor, captions: Tensor, lengths: Tensor, mode: Optional[str] = None,
                       use_expected: Optional[Tensor] = None, locations: Optional[Tensor] = None,
                       temperature: float = 1.0) -> DecoderOutput:
        """The teacher-forced pass with static shapes: every row of the batch at every one of the T
        steps (the captions padded to T + 1 tokens), the steps past a caption's end computed and
        masked, not skipped; nothing read back to the host (no sorting by length, no counts, no
        boolean indexing), so that the pass, its backward and the optimiser step can be captured
        as one CUDA graph per (B, T) and replayed. The outputs are :meth:`forward`'s, except that
        ``logits`` is (B, T, V), every step's, for the losses to mask. A caption's real steps come
        first, so the padded steps after them change nothing before them: the loss and gradients
        equal the shrinking-batch pass's (tests/test_static_shapes.py, float64). Hard attention
        samples with :func:`graph_safe_sampling`."""
        mode = self._mode(mode)
        T = captions.size(1) - 1
        steps = (lengths - 1).clamp(min=0, max=T)
        mask = torch.arange(T, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T)
        embedded = self.embedding(captions[:, :-1])  # (B, T, M)
        sampling = mode in ("sample", "gumbel")
        with graph_safe_sampling():
            if self.luong:
                hs, zs, alphas, betas, where, *rest = self._luong_static_steps(features, embedded, mode, use_expected,
                                                                               locations, temperature)
                logits = self.deep_output(embedded, self.attentional_state(zs, hs), zs)  # (B, T, V)
            else:
                x_steps = self.embed_gates(embedded).unbind(1)  # T x (B, 4H)
                state = self.initial_state(features)
                layers = (deferred_linear(self.from_hidden), deferred_linear(self.context_gates))
                per_step = []
                for t in range(T):
                    h, c, z, g, beta = self.recurrent_step(x_steps[t], state, mode, use_expected,
                                                           None if locations is None else locations[:, t], layers, temperature)
                    state = state.with_recurrent(h, c)
                    per_step.append((h, z, g.alpha, beta, g.location) + ((g.log_prob, g.entropy) if sampling else ())
                                    + ((g.head_alpha,) if self.heads > 1 else ()))
                hs, zs, alphas, betas, where, *rest = (torch.stack(column, 1) for column in zip(*per_step))
                logits = self.deep_output(embedded, hs, zs)  # (B, T, V)

        def masked(values: Tensor) -> Tensor:  # zero at padded steps, as forward() leaves them
            m = mask.view(mask.shape + (1,) * (values.dim() - 2))
            return values * m if values.is_floating_point() else values.masked_fill(~m, 0)

        return self._output(logits, mask, masked, alphas, betas, where, rest, sampling)

    def _luong_static_steps(self, features: Tensor, embedded: Tensor, mode: str, use_expected: Optional[Tensor],
                            locations: Optional[Tensor], temperature: float) -> list[Tensor]:
        """Luong placement for :meth:`static_forward`: the LSTM over all T steps, then attention for all
        B x T steps in one batched product (the T steps of an image are T "beams" over its features).
        Returns (B, T, ...) h, z, alpha, beta, location (and log p(s), entropy; the heads' alphas)."""
        B, T = embedded.shape[:2]
        state = self.initial_state(features)
        hs, _ = self.lstm(embedded, (state.h.unsqueeze(0).contiguous(), state.c.unsqueeze(0).contiguous()))  # (B, T, H)
        h = hs.reshape(B * T, -1)
        g, beta, z = self.attend(state, self.from_output(h), h, mode,
                                 None if use_expected is None else use_expected.repeat_interleave(T),
                                 None if locations is None else locations.reshape((B * T,) + locations.shape[2:]),
                                 beams=T, temperature=temperature)
        columns = [h, z, g.alpha, beta, g.location] + ([g.log_prob, g.entropy] if mode in ("sample", "gumbel") else []) \
            + ([g.head_alpha] if self.heads > 1 else [])
        return [x.reshape((B, T) + x.shape[1:]) for x in columns]

    #: Luong's teacher-forced pass attends for the images in groups of about this many, sorted by
    #: length, each group over its own longest caption's steps (fewer padded steps than B x T).
    LUONG_GROUP = 8

    def _luong_forward(self, features: Tensor, captions: Tensor, lengths: Tensor, mode: str,
                       use_expected: Optional[Tensor], locations: Optional[Tensor],
                       temperature: float = 1.0) -> DecoderOutput:
        """The teacher-forced pass with Luong placement: the LSTM over all T steps in one call
        (nn.LSTM: cuDNN on a GPU, oneDNN on the CPU), then attention, contexts and attentional
        states for all steps in batched products: the images sorted by length and taken in groups
        of :attr:`LUONG_GROUP`, the T_g steps of a group's image being T_g "beams" over its
        features (one product per group, not per step). Steps past a caption's end are computed
        within a group and dropped: nothing reaches the outputs or the loss from them."""
        B, L, _ = features.shape
        T = captions.size(1) - 1
        device = captions.device
        steps = (lengths - 1).clamp(min=0, max=T)
        mask = torch.arange(T, device=device).unsqueeze(0) < steps.unsqueeze(1)  # (B, T)
        embedded = self.embedding(captions[:, :-1])  # (B, T, M)
        state = self.initial_state(features)
        hs, _ = self.lstm(embedded, (state.h.unsqueeze(0).contiguous(), state.c.unsqueeze(0).contiguous()))  # (B, T, H)
        steps_sorted, order = steps.sort(descending=True)
        longest = steps_sorted.tolist()  # one host sync per batch
        from_out = self.from_output(hs)  # (B, T, query + 1 + local), all steps in one product
        parts, flats = [], []
        for start in range(0, B, self.LUONG_GROUP):
            Tg = longest[start]
            if Tg == 0:
                break
            rows = order[start : start + self.LUONG_GROUP]
            n = rows.numel()
            sub = DecoderState(None, None, state.features[rows], state.projected[rows])
            h = hs[rows, :Tg].reshape(n * Tg, -1)
            g, beta, z = self.attend(sub, from_out[rows, :Tg].reshape(n * Tg, -1), h, mode,
                                     None if use_expected is None else use_expected[rows].repeat_interleave(Tg),
                                     None if locations is None else locations[rows, :Tg].reshape((n * Tg,) + locations.shape[2:]),
                                     beams=Tg, temperature=temperature)
            parts.append((h, z, g.alpha, beta, g.location) + ((g.log_prob, g.entropy) if mode in ("sample", "gumbel") else ())
                         + ((g.head_alpha,) if self.heads > 1 else ()))
            flats.append((rows.unsqueeze(1) * T + torch.arange(Tg, device=device)).reshape(-1))
        flat = torch.cat(flats)  # where each computed row belongs in the caller's (B, T) grid
        hs_, zs, alphas, betas, where, *rest = (torch.cat(column) for column in zip(*parts))
        keep = mask.reshape(-1)[flat]
        real = flat[keep]
        in_mask_order = real.argsort()  # mask.nonzero() is row-major over the caller's (B, T)
        pick = keep.nonzero().squeeze(1)[in_mask_order]
        h_real, z_real = hs_[pick], zs[pick]
        logits = self.deep_output(embedded.reshape(B * T, -1)[real[in_mask_order]], self.attentional_state(z_real, h_real), z_real)

        def grid(values: Tensor) -> Tensor:  # computed rows -> (B, T, ...), zero at padded steps
            out = values.new_zeros((B * T,) + values.shape[1:])
            return out.index_copy(0, real, values[keep]).view((B, T) + values.shape[1:])

        sampling = mode in ("sample", "gumbel")
        return self._output(logits, mask, grid, alphas, betas, where, rest, sampling)

    # ------------------------------------------------------------------ generation
    def step(self, tokens: Tensor, state: DecoderState, mode: Optional[str] = None,
             attention_temperature: float = 1.0) -> tuple[Tensor, DecoderState, Glimpse]:
        """One generation step: previous tokens (N,) -> log p(y_t) (N, V), the new state, the glimpse.

        ``attention_temperature``: a hard-attention model in mode "expected" takes the expected
        context under softmax(log alpha / tau) (see :func:`glimpse`); soft models ignore it."""
        embedded = self.embedding(tokens)  # (N, M)
        mode = self._mode(mode)
        tau = attention_temperature if self.attention_kind == "hard" and mode == "expected" else 1.0
        if self.luong:
            h, c, z, g, _ = self._luong_step(embedded, state, mode, None, None, tau)
            logits = self.deep_output(embedded, self.attentional_state(z, h), z)
            return F.log_softmax(logits.float(), dim=-1), state.with_recurrent(h, c), g
        h, c, z, g, _ = self.recurrent_step(self.embed_gates(embedded), state, mode, temperature=tau)
        logits = self.deep_output(embedded, h, z)
        return F.log_softmax(logits.float(), dim=-1), state.with_recurrent(h, c), g


def grid_position_embedding(gh: int, gw: int, dim: int, device=None, dtype=torch.float32) -> Tensor:
    """2-D sinusoidal position embeddings (L, dim): the first half of the channels encode the row,
    the second half the column, each as Vaswani et al.'s sin/cos pairs."""
    half = dim // 2
    freqs = torch.exp(torch.arange(0, half, 2, device=device, dtype=dtype) * (-math.log(10000.0) / half))  # (half / 2,)

    def encode(pos: Tensor) -> Tensor:  # (n,) -> (n, half)
        x = pos.to(dtype).unsqueeze(1) * freqs
        return torch.stack([x.sin(), x.cos()], dim=-1).flatten(1)[:, :half]

    rows = encode(torch.arange(gh, device=device)).repeat_interleave(gw, 0)  # (L, half)
    cols = encode(torch.arange(gw, device=device)).repeat(gh, 1)
    emb = torch.cat([rows, cols], dim=1)
    return F.pad(emb, (0, dim - emb.size(1)))


class GridRefiner(nn.Module):
    """Self-attention over the L annotation vectors before decoding: ``layers`` Transformer encoder
    layers (pre-norm, feed-forward 2D) over a_i + pos(row_i, col_i). (B, L, D) -> (B, L, D)."""

    def __init__(self, dim: int, layers: int, heads: int, dropout: float):
        super().__init__()
        if dim % heads:
            raise ConfigError(f"model.decoder.refiner_heads: the feature width ({dim}) must be a multiple of refiner_heads ({heads})")
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, features: Tensor) -> Tensor:
        gh, gw = grid_shape(features.size(1))
        pos = grid_position_embedding(gh, gw, features.size(-1), features.device, features.dtype)
        return self.layers(features + pos)
