"""The LSTM decoder's fast twin: models/decoder.py's function (and attention/luong.py's), computed faster.

Built from a plain decoder's own parameters (nothing is copied: the fused products are made from
them at each pass, or once while no gradient is made), held equal to it by the tests in float64.

- fused products: every product of the state h (W_h, f_beta, the local window's W_p, T's
  recurrent columns) is one matrix product per step; T's embedding columns run for all steps at once;
- the shrinking batch (:meth:`FastLSTM.packed`): captions sorted by length, only those still running
  take part in a step, and the output layer runs once over the real steps;
- one weight gradient per repeated product and one gradient buffer for the rows read (gradients.py);
- the additive score through tanh(y) = 2 sigmoid(2y) - 1 (the CPU's sigmoid kernel is cheaper),
  chunked and in place while decoding on the CPU (:func:`additive_scores`);
- Luong's placement: the LSTM over every step in one call, attention for all steps in batched products;
- the static pass (every row at every step, nothing read back to the host, graph-safe sampling)
  that CUDA graphs capture, and ``compile_step``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.fast.gradients import FirstRows, Linear, deferred_linear
from captioning.models.attention.dot import ScaledDot
from captioning.models.attention.local import LocalWindow
from captioning.models.attention.luong import LuongDecoder
from captioning.models.decoder import (
    AdditiveScore,
    DecoderOutput,
    DecoderState,
    DecoderStates,
    Glimpse,
    ShowAttendTellDecoder,
    glimpse,
    lstm_cell,
    per_row,
)

#: decoding on the CPU computes the additive scores a few images at a time, about this many values
#: of the (images, beams, L, A) tensor at once (4 MB in float32)
CPU_CHUNK_ELEMENTS = 1024 * 1024
#: Luong's teacher-forced pass attends for the images in groups of about this many, sorted by length
LUONG_GROUP = 8


# ---------------------------------------------------------------------- the additive score, fast
def additive_scores(projected: Tensor, query: Tensor, w: Tensor, beams: int = 1) -> Tensor:
    """Eq. 4 as e_ti = (2w)^T sigmoid(2 W_a a_i + 2 W_h h + 2b) - sum(w) (the same number and gradient
    as w^T tanh(.)): projected (B, L, A), query W_h h (B * beams, A), w (heads, A / heads) ->
    (B * beams, L), or (B * beams, heads, L)."""
    B, L, A = projected.shape
    heads = w.size(0)
    hidden = (2 * query).view(B, beams, 1, A)
    shift = -w.sum(1)  # (heads,)
    if heads > 1:
        blocks = torch.block_diag(*(2 * w).unsqueeze(-1))  # (A, heads): w_k in rows k*a..(k+1)*a of column k
        e = torch.matmul(torch.sigmoid(torch.add(hidden, projected.unsqueeze(1), alpha=2)), blocks) + shift
        return e.transpose(2, 3).reshape(B * beams, heads, L)
    w2 = 2 * w.view(A)
    if torch.is_grad_enabled() or torch.jit.is_tracing():  # a traced (ONNX) graph: one form for every batch
        e = torch.matmul(torch.sigmoid(torch.add(hidden, projected.unsqueeze(1), alpha=2)), w2)  # (B, beams, L)
    else:
        e = _additive_scores_no_grad(projected, hidden, w2)
    return (e + shift).view(B * beams, L)


def _additive_scores_no_grad(projected: Tensor, hidden: Tensor, w2: Tensor) -> Tensor:
    """(2w)^T sigmoid(2y) without autograd, in place, and on the CPU a few images at a time (each
    chunk's tensor stays small enough for the allocator to reuse and the cache to hold)."""
    B, L, A = projected.shape
    beams = hidden.size(1)
    w2 = w2.to(torch.promote_types(projected.dtype, hidden.dtype))  # bf16 under autocast
    chunk = max(1, CPU_CHUNK_ELEMENTS // (beams * L * A)) if projected.device.type == "cpu" else B
    e = projected.new_empty(B, beams, L)
    for i in range(0, B, chunk):
        y2 = torch.add(hidden[i : i + chunk], projected[i : i + chunk].unsqueeze(1), alpha=2)
        torch.matmul(y2.sigmoid_(), w2, out=e[i : i + chunk])
    return e


def sample_location(alpha: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """s_t ~ Cat(alpha_t) as argmax_i alpha_ti / E_i with E_i ~ Exp(1) (the same distribution), from
    random numbers a captured CUDA graph replays: alpha (N, L) -> (N,)."""
    e = torch.empty(alpha.shape, device=alpha.device, dtype=torch.float32).exponential_(generator=generator)
    return (alpha.detach().float() / e).argmax(-1)


# ---------------------------------------------------------------------- one step's outputs
class StepOutput(NamedTuple):
    """What a step gives for N rows (one step's captions, or the rows of many steps joined)."""

    h: Tensor  # (N, H)
    c: Tensor | None  # (N, H); None where the LSTM ran every step at once (Luong)
    z: Tensor  # (N, D)
    beta: Tensor  # (N,)
    alpha: Tensor  # (N, L)
    location: Tensor  # (N,) or (N, heads)
    log_prob: Tensor | None = None
    entropy: Tensor | None = None
    head_alpha: Tensor | None = None
    context: Tensor | None = None  # one step's context before the gate (join drops it)
    views: dict | None = None  # one step's Glimpse.views (join drops them)

    @classmethod
    def of(cls, h: Tensor, c: Tensor | None, z: Tensor, beta: Tensor, g: Glimpse) -> StepOutput:
        return cls(h, c, z, beta, g.alpha, g.location, g.log_prob, g.entropy, g.head_alpha, g.context, g.views)

    @property
    def glimpse(self) -> Glimpse:
        return Glimpse(
            self.context, self.alpha, self.location, self.log_prob, self.entropy, self.head_alpha, self.views or {}
        )

    def map(self, fn: Callable[[Tensor], Tensor]) -> StepOutput:
        return StepOutput(
            *(None if x is None or name in ("context", "views") else fn(x) for name, x in zip(self._fields, self))
        )

    @staticmethod
    def join(steps: Sequence[StepOutput], combine: Callable[[list], Tensor] = torch.cat) -> StepOutput:
        """Several outputs field by field (rows after rows); c and context are left out."""
        return StepOutput(
            *(
                None if column[0] is None or name in ("c", "context", "views") else combine(list(column))
                for name, column in zip(StepOutput._fields, zip(*steps))
            )
        )


class Fused(NamedTuple):
    """The plain decoder's parameters as the fast products read them."""

    hidden: tuple[Tensor, Tensor]  # products of h: [query (Q) | f_beta (1) | W_p (P) | T's h columns (4H, Bahdanau)]
    embed: Tensor  # T's E y columns (4H, M)
    context: Tensor | None  # T's z columns (4H, D); None for Luong
    recurrent: tuple[Tensor, Tensor] | None  # Luong: T's h columns and T's bias


def _output(logits: Tensor, mask: Tensor, place: Callable[[Tensor], Tensor], out: StepOutput) -> DecoderOutput:
    return DecoderOutput(
        logits,
        mask,
        place(out.alpha),
        place(out.beta),
        place(out.location),
        None if out.log_prob is None else place(out.log_prob),
        None if out.entropy is None else place(out.entropy),
        None if out.head_alpha is None else place(out.head_alpha),
    )


def _masked(mask: Tensor) -> Callable[[Tensor], Tensor]:
    """(B, T, ...) values -> zero at the padded steps of ``mask`` (B, T)."""

    def place(values: Tensor) -> Tensor:
        m = mask.view(mask.shape + (1,) * (values.dim() - 2))
        return values * m if values.is_floating_point() else values.masked_fill(~m, 0)

    return place


def _real_steps(captions: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    T = captions.size(1) - 1
    steps = (lengths - 1).clamp(min=0, max=T)
    return steps, torch.arange(T, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)


# ---------------------------------------------------------------------- the twin
class FastLSTM:
    """The fast form of ``decoder`` (a :class:`ShowAttendTellDecoder` or :class:`LuongDecoder` of
    any score, heads, window, AoA or refiner): the decoder interface the search loops and the
    objectives call (``forward``, ``initial_state``, ``step``), reading ``decoder``'s parameters."""

    takes_attention_bias = True
    state_layout = DecoderStates

    def __init__(self, decoder: ShowAttendTellDecoder):
        self.plain = decoder
        self.config = decoder.config
        self.luong = isinstance(decoder, LuongDecoder)
        self.whole_sequence = self.luong
        score = decoder.f_att
        self.additive = type(score) is AdditiveScore
        self.query_layer = score.W_h if self.additive else score.W_q if type(score) is ScaledDot else None
        self.local = type(decoder.window) is LocalWindow
        H, M = decoder.hidden_dim, decoder.E.embedding_dim
        Q = 0 if self.query_layer is None else self.query_layer.out_features
        P = decoder.window.W_p.out_features if self.local else 0
        self.M, self.H, self.splits = M, H, [Q, 1, P]
        self.width = Q + 1 + P
        self._search: Fused | None = None  # the fused products of the search under way (initial_state)
        step = self._luong_step if self.luong else self._step
        self.step_fn = torch.compile(step, dynamic=True) if decoder.config.compile_step else step

    # the decoder's own attributes, as the search loops and objectives read them
    @property
    def attention_kind(self) -> str:
        return self.plain.attention_kind

    @property
    def vocab_size(self) -> int:
        return self.plain.vocab_size

    @property
    def bad_ending_ids(self):
        return self.plain.bad_ending_ids

    @property
    def training(self) -> bool:
        return self.plain.training

    def train(self, mode: bool = True) -> FastLSTM:
        """Train or eval mode: the plain decoder's (its dropout), which the twin runs."""
        self.plain.train(mode)
        return self

    def eval(self) -> FastLSTM:
        return self.train(False)

    def initial_state(self, features: Tensor, max_steps: int | None = None) -> DecoderState:
        """The plain decoder's, and the fused products of the parameters as they are now, which the
        search's steps then read (a search starts here; the parameters do not change within it)."""
        self._search = None if torch.is_grad_enabled() else self.weights()
        return self.plain.initial_state(features, max_steps)

    # ------------------------------------------------------------------ the fused parameters
    def weights(self) -> Fused:
        """The fused products, made from the plain parameters as they are (gradients flow back to
        them). Nothing is kept between passes: an optimizer (fused Adam) may change the parameters
        in place without a trace a cache could check."""
        d = self.plain
        M, H = self.M, self.H
        T, zero = d.T, d.f_beta.bias.new_zeros
        rows = [d.f_beta.weight]
        bias = [d.f_beta.bias]
        if self.query_layer is not None:
            q = self.query_layer
            rows.insert(0, q.weight)
            bias.insert(0, q.bias if q.bias is not None else zero(q.out_features))
        if self.local:
            rows.append(d.window.W_p.weight)
            bias.append(d.window.W_p.bias)
        if self.luong:
            fused = Fused((torch.cat(rows), torch.cat(bias)), T.weight[:, :M], None, (T.weight[:, M : M + H], T.bias))
        else:
            rows.append(T.weight[:, M : M + H])
            bias.append(T.bias)
            fused = Fused((torch.cat(rows), torch.cat(bias)), T.weight[:, :M], T.weight[:, M + H :], None)
        return fused

    # ------------------------------------------------------------------ one step
    def attend(self, from_h, h, state, mode, use_expected=None, location=None, temperature=1.0,
               graph_safe=False, beams=None):  # fmt: skip
        """The plain decoder's ``attend`` from the fused products of h ``from_h`` (N, width)."""
        d, beams = self.plain, state.beams if beams is None else beams
        Q, _, P = self.splits
        query = from_h[:, :Q] if Q else d.f_att.query(h)
        if self.additive:
            e = additive_scores(state.projected, query, d.f_att.w, beams)
        else:
            e = d.f_att.scores(state.projected, query, beams)
        if state.bias is not None:
            bias = per_row(state.bias, beams)
            e = e + (bias.unsqueeze(1) if e.dim() == 3 else bias)
        window = None
        if self.local:
            gh, gw = grid_shape(state.features.size(1))
            centre = torch.sigmoid(d.window.v_p(torch.tanh(from_h[:, Q + 1 : Q + 1 + P]))) * h.new_tensor(
                [gh - 1, gw - 1]
            )
            log_w = d.window.log_window(centre, gh, gw)
            alpha = d.normalizer(e + (log_w.unsqueeze(1) if e.dim() == 3 else log_w))
            window = torch.cat([centre, centre.new_full((centre.size(0), 1), d.window.sigma)], 1)
        elif d.window is None:
            alpha = d.normalizer(e)
        else:
            alpha, window = d.window(e, h, state, d.normalizer)
        if graph_safe and mode == "sample" and location is None:
            location = sample_location(alpha.reshape(-1, alpha.size(-1))).view(alpha.shape[:-1])
        if d.multi_head is None:
            g = glimpse(alpha, state.features, mode, use_expected, location, beams, temperature)
        else:
            g = d.multi_head(alpha, state.features, mode, use_expected, location, beams, temperature)
        context = g.context if d.aoa is None else d.aoa(g.context, h)
        beta = torch.sigmoid(from_h[:, Q])
        g.views.update(gate=beta, **({} if window is None else {"window": window}))
        return g, beta, beta.unsqueeze(1) * context

    def inputs(self, Ey: Tensor, w: Fused) -> Tensor:
        """The step's input from E y (..., M): T's embedding columns (Bahdanau), or E y itself (Luong)."""
        return Ey if self.luong else F.linear(Ey, w.embed)

    def layers(self, w: Fused, deferred: bool) -> tuple:
        """The products a pass repeats at every step (one weight gradient each when ``deferred``)."""
        make = deferred_linear if deferred else Linear
        if self.luong:
            return make(*w.hidden), Linear(w.embed), Linear(*w.recurrent)
        return make(*w.hidden), make(w.context)

    def _step(self, x, state, mode, use_expected=None, location=None, temperature=1.0, graph_safe=False,
              layers=()) -> StepOutput:  # fmt: skip
        """Bahdanau: x (N, 4H) from :meth:`inputs` -> h_t, c_t, z_t, the glimpse."""
        hidden, context = layers
        from_h, h_gates = hidden(state.h).split([self.width, 4 * self.H], 1)
        g, beta, z = self.attend(from_h, state.h, state, mode, use_expected, location, temperature, graph_safe)
        h, c = lstm_cell(x + h_gates + context(z), state.c)  # Eq. 1-3
        return StepOutput.of(h, c, z, beta, g)

    def _luong_step(self, x, state, mode, use_expected=None, location=None, temperature=1.0, graph_safe=False,
                    layers=()) -> StepOutput:  # fmt: skip
        """Luong: x (N, M) = E y -> the LSTM, then attention from h_t."""
        hidden, embed, recurrent = layers
        h, c = lstm_cell(embed(x) + recurrent(state.h), state.c)
        g, beta, z = self.attend(hidden(h), h, state, mode, use_expected, location, temperature, graph_safe)
        return StepOutput.of(h, c, z, beta, g)

    def step(self, tokens: Tensor, state: DecoderState, mode: str | None = None, attention_temperature: float = 1.0):
        """The plain decoder's ``step``: tokens (N,) -> log p (N, V), the new state, the glimpse."""
        d = self.plain
        mode = d.attention_mode(mode)
        Ey = d.E(tokens)
        tau = attention_temperature if d.attention_kind == "hard" and mode == "expected" else 1.0
        w = self._search if self._search is not None and not torch.is_grad_enabled() else self.weights()
        out = self.step_fn(self.inputs(Ey, w), state, mode, temperature=tau, layers=self.layers(w, deferred=False))
        logits = d.deep_output(Ey, out.h, out.z)
        log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        return log_probs, state.with_recurrent(out.h, out.c), out.glimpse

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, features, captions, lengths, mode=None, use_expected=None, locations=None, temperature=1.0,
                static=False, sample_prob=0.0) -> DecoderOutput:  # fmt: skip
        """The plain decoder's ``forward``: the shrinking batch (Luong: the whole sequence at once),
        the static pass with ``static``, or scheduled sampling with ``sample_prob`` > 0."""
        mode = self.plain.attention_mode(mode)
        self._search = None  # a search after this pass makes its products anew (initial_state)
        if sample_prob > 0:
            if self.attention_kind != "soft":
                raise ConfigError(
                    "model.objective.scheduled_sampling_start: scheduled sampling trains soft attention only"
                )
            return self.every_step(features, captions, lengths, mode, None, None, 1.0, sample_prob=sample_prob)
        if static:
            return self.every_step(features, captions, lengths, mode, use_expected, locations, temperature, True)
        run = self.luong_sequence if self.luong else self.packed
        return run(features, captions, lengths, mode, use_expected, locations, temperature)

    __call__ = forward

    def packed(self, features, captions, lengths, mode, use_expected, locations, temperature) -> DecoderOutput:
        """The shrinking batch: the captions sorted by length, so that the n_t still running at
        step t are the first n_t rows; one host read per batch (the running counts)."""
        d = self.plain
        B, T = features.size(0), captions.size(1) - 1
        steps, mask = _real_steps(captions, lengths)
        steps_sorted, order = steps.sort(descending=True)
        running = (steps_sorted.unsqueeze(0) > torch.arange(T, device=steps.device).unsqueeze(1)).sum(1)
        active = [n for n in running.tolist() if n > 0]
        features, captions = features[order], captions[order]
        use_expected = None if use_expected is None else use_expected[order]
        forced = None if locations is None else locations[order]
        w = self.weights()
        embedded = d.E(captions[:, :-1])  # (B, T, M)
        x_steps = self.inputs(embedded, w).unbind(1)  # T x (B, 4H)
        state = d.initial_state(features)
        layers = self.layers(w, deferred=True)
        # the image rows each step reads, with one gradient buffer each; each step's outputs kept as
        # they come and put in place once after the loop
        features_rows, projected_rows = FirstRows(state.features), FirstRows(state.projected)
        per_step = []
        steps_taken = state.t
        for t, n in enumerate(active):
            h, c = (state.h, state.c) if n == state.h.size(0) else (state.h[:n], state.c[:n])
            state = DecoderState(h, c, features_rows(n), projected_rows(n), t=steps_taken[:n] + t)
            out = self.step_fn(
                x_steps[t][:n],
                state,
                mode,
                None if use_expected is None else use_expected[:n],
                None if forced is None else forced[:n, t],
                temperature,
                layers=layers,
            )
            state = state.with_recurrent(out.h, out.c)
            per_step.append(out)
        out = StepOutput.join(per_step)  # step-major rows
        device = steps.device
        step_of = torch.repeat_interleave(torch.arange(len(active), device=device), torch.tensor(active, device=device))
        row_of = torch.cat([torch.arange(n, device=device) for n in active])  # sorted row
        flat = order[row_of] * T + step_of  # (N,): index into the caller's (B, T) grid
        in_mask_order = flat.argsort()  # mask.nonzero() is row-major

        def grid(values: Tensor) -> Tensor:  # packed rows -> (B, T, ...), zero at padded steps
            return (
                values.new_zeros((B * T,) + values.shape[1:])
                .index_copy(0, flat, values)
                .view((B, T) + values.shape[1:])
            )

        sorted_flat = (row_of * T + step_of)[in_mask_order]
        h, z = out.h[in_mask_order], out.z[in_mask_order]
        logits = d.deep_output(embedded.reshape(B * T, -1)[sorted_flat], h, z)  # (N, V), once
        return _output(logits, mask, grid, out)

    def luong_sequence(self, features, captions, lengths, mode, use_expected, locations, temperature,
                       graph_safe=False) -> DecoderOutput:  # fmt: skip
        """Luong's pass: the LSTM over every step in one call, then attention for all steps in
        batched products, the images sorted by length in groups of :data:`LUONG_GROUP` (each
        image's T_g steps are T_g "beams" over its features); steps past a caption's end dropped.
        ``graph_safe``: every row and step at once, nothing read back (the static pass)."""
        d = self.plain
        B, T = features.size(0), captions.size(1) - 1
        device = captions.device
        steps, mask = _real_steps(captions, lengths)
        w = self.weights()
        embedded = d.E(captions[:, :-1])  # (B, T, M)
        state = d.initial_state(features)
        hs = self.lstm_sequence(embedded, state, w)  # (B, T, H)
        from_h = F.linear(hs, *w.hidden)  # (B, T, width)
        if graph_safe:
            out = self._attend_steps(hs, state, mode, use_expected, locations, temperature, True, from_h)
            out = out.map(lambda x: x.reshape((B, T) + x.shape[1:]))
            return _output(d.deep_output(embedded, out.h, out.z), mask, _masked(mask), out)
        steps_sorted, order = steps.sort(descending=True)
        longest = steps_sorted.tolist()  # one host read per batch
        parts, flats = [], []
        for start in range(0, B, LUONG_GROUP):
            Tg = longest[start]
            if Tg == 0:
                break
            rows = order[start : start + LUONG_GROUP]
            group = DecoderState(None, None, state.features[rows], state.projected[rows], t=state.t[rows])
            parts.append(
                self._attend_steps(
                    hs[rows, :Tg],
                    group,
                    mode,
                    None if use_expected is None else use_expected[rows],
                    None if locations is None else locations[rows, :Tg],
                    temperature,
                    False,
                    from_h[rows, :Tg],
                )
            )
            flats.append((rows.unsqueeze(1) * T + torch.arange(Tg, device=device)).reshape(-1))
        flat = torch.cat(flats)
        out = StepOutput.join(parts)
        keep = mask.reshape(-1)[flat]
        real = flat[keep]
        in_mask_order = real.argsort()
        pick = keep.nonzero().squeeze(1)[in_mask_order]
        h, z = out.h[pick], out.z[pick]
        logits = d.deep_output(embedded.reshape(B * T, -1)[real[in_mask_order]], h, z)

        def grid(values: Tensor) -> Tensor:
            return (
                values.new_zeros((B * T,) + values.shape[1:])
                .index_copy(0, real, values[keep])
                .view((B, T) + values.shape[1:])
            )

        return _output(logits, mask, grid, out)

    def lstm_sequence(self, embedded: Tensor, state: DecoderState, w: Fused) -> Tensor:
        """h_t of every step from E y (B, T, M) in one call of PyTorch's LSTM kernel -> (B, T, H)."""
        w_hh, b = w.recurrent
        params = [w.embed, w_hh, b, torch.zeros_like(b)]
        hx = (state.h.unsqueeze(0).contiguous(), state.c.unsqueeze(0).contiguous())
        return torch.lstm(embedded, hx, params, True, 1, 0.0, self.plain.training, False, True)[0]

    def _attend_steps(self, hs, state, mode, use_expected, locations, temperature, graph_safe, from_h) -> StepOutput:
        """Attention for all T steps of n images at once: hs (n, T, H) -> n * T rows, image-major."""
        n, T = hs.shape[:2]
        h = hs.reshape(n * T, -1)
        state = dataclasses.replace(state, t=torch.arange(T, device=hs.device).repeat(n))  # each row's step
        g, beta, z = self.attend(
            from_h.reshape(n * T, -1),
            h,
            state,
            mode,
            None if use_expected is None else use_expected.repeat_interleave(T),
            None if locations is None else locations.reshape((n * T,) + locations.shape[2:]),
            temperature,
            graph_safe,
            beams=T,
        )
        return StepOutput.of(h, None, z, beta, g)

    def every_step(self, features, captions, lengths, mode, use_expected, locations, temperature, graph_safe=False,
                   sample_prob=0.0) -> DecoderOutput:  # fmt: skip
        """Every row at every one of the T steps, padded steps masked: the static pass (nothing read
        back to the host, graph-safe sampling) or, with ``sample_prob``, scheduled sampling (each
        step reads, with that probability per caption, a word drawn from the previous step's output)."""
        if self.luong and not sample_prob:
            return self.luong_sequence(features, captions, lengths, mode, use_expected, locations, temperature, True)
        d = self.plain
        B, T = features.size(0), captions.size(1) - 1
        _, mask = _real_steps(captions, lengths)
        w = self.weights()
        state = d.initial_state(features)
        layers = self.layers(w, deferred=True)
        tokens, per_step, logits = captions[:, 0], [], []
        for t in range(T):
            if t > 0:
                tokens = captions[:, t]
                if sample_prob > 0:
                    sampled = torch.multinomial(torch.softmax(logits[-1].detach().float(), -1), 1).squeeze(1)
                    tokens = torch.where(torch.rand(B, device=tokens.device) < sample_prob, sampled, tokens)
            Ey = d.E(tokens)
            where = None if locations is None else locations[:, t]
            out = self.step_fn(self.inputs(Ey, w), state, mode, use_expected, where, temperature, graph_safe, layers)
            state = state.with_recurrent(out.h, out.c)
            if sample_prob > 0:  # the next step reads this one's words
                logits.append(d.deep_output(Ey, out.h, out.z))
            per_step.append(out)
        out = StepOutput.join(per_step, lambda column: torch.stack(column, 1))  # (B, T, ...) each
        logits = torch.stack(logits, 1) if sample_prob > 0 else d.deep_output(d.E(captions[:, :-1]), out.h, out.z)
        return _output(logits, mask, _masked(mask), out)
