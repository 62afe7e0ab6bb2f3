"""The decoder's time step, written once per attention placement (``DecoderConfig.placement``).

- :class:`BahdanauCell`, the paper's (Section 3.1.2): attend from h_{t-1}, then the LSTM reads
  [E y_{t-1}; h_{t-1}; z_t] (Eq. 1-3); the deep output reads h_t.
- :class:`LuongCell` (Luong et al. 2015, without input feeding): the LSTM reads E y_{t-1}, then
  attend from h_t; the deep output reads the attentional state h~_t = tanh(W_c [z_t; h_t]).

Both attend with :class:`Attend`, the general attention of every variant (score, heads, window);
the paper's attention is its additive, one-head, global case. Every pass calls a cell's ``step``:
the teacher-forced unrollings (unroll.py), the decoding step (``decoder.step``) and the ONNX step
graph (export/onnx.py). What a step gives is one :class:`StepOutput`, for one step's rows or for
many steps' rows joined.

The cells own no parameters: they hold the decoder's layers, which the decoder registers under
the names its checkpoints have always used (``from_hidden``, ``lstm``, ``combine``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.models.attention import Glimpse, LocalCentre, Score, glimpse, window_log
from captioning.models.deferred import deferred_linear


@dataclass
class DecoderState:
    """The recurrent state of a batch of N rows (images, or images x beams) during generation."""

    h: Tensor  # (N, H)
    c: Tensor  # (N, H)
    features: Tensor  # (N / beams, L, D)
    projected: Tensor  # (N / beams, L, A): W_a a, computed once
    beams: int = 1  # rows per image: rows k * beams ... (k + 1) * beams - 1 share image k's features
    #: (N / beams, L) added to every step's attention scores before the softmax, per image: a prior
    #: over the locations (decoding/steering.py's focus); None: none
    bias: Tensor | None = None

    def select(self, index: Tensor) -> DecoderState:
        """Rows ``index`` (a slice, or (N',) indices) of every tensor; one row per image only."""
        if self.beams != 1:
            raise ValueError("select() needs one row per image; beams share their image's features")
        bias = None if self.bias is None else self.bias[index]
        return DecoderState(self.h[index], self.c[index], self.features[index], self.projected[index], bias=bias)

    def with_recurrent(self, h: Tensor, c: Tensor) -> DecoderState:
        """The same images (features) with a new recurrent state."""
        return DecoderState(h, c, self.features, self.projected, self.beams, self.bias)

    def expand_beams(self, beams: int) -> DecoderState:
        """Each image's state copied to ``beams`` rows; the features stay one copy per image."""
        if self.beams != 1:
            raise ValueError("expand_beams() of a state that already has beams")
        return DecoderState(
            self.h.repeat_interleave(beams, 0),
            self.c.repeat_interleave(beams, 0),
            self.features,
            self.projected,
            beams,
            self.bias,
        )


class StepOutput(NamedTuple):
    """What a step gives for N rows (one step's captions, or the rows of many steps joined)."""

    h: Tensor  # (N, H): h_t
    c: Tensor | None  # (N, H): c_t (None where nn.LSTM ran the steps: Luong's whole-sequence pass)
    z: Tensor  # (N, D): the gated context beta_t phi(a, alpha_t)
    beta: Tensor  # (N,): the gate scalar beta_t
    alpha: Tensor  # (N, L): the attention weights (their mean over heads with several heads)
    location: Tensor  # (N,): the chosen (hard) or argmax (soft) location; (N, heads) for hard multi-head
    log_prob: Tensor | None = None  # (N,): log p(s_t | a), the sampling modes
    entropy: Tensor | None = None  # (N,): H[alpha_t], the sampling modes
    head_alpha: Tensor | None = None  # (N, heads, L) with several heads
    context: Tensor | None = None  # the glimpse's context before the gate (one step's; join drops it)

    @classmethod
    def of(cls, h: Tensor, c: Tensor | None, z: Tensor, beta: Tensor, g: Glimpse) -> StepOutput:
        return cls(h, c, z, beta, g.alpha, g.location, g.log_prob, g.entropy, g.head_alpha, g.context)

    @property
    def glimpse(self) -> Glimpse:
        """The attention step's :class:`Glimpse` (what ``decoder.step`` returns)."""
        return Glimpse(self.context, self.alpha, self.location, self.log_prob, self.entropy, self.head_alpha)

    def map(self, fn: Callable[[Tensor], Tensor]) -> StepOutput:
        """``fn`` of every field but ``context`` (None stays None)."""
        return StepOutput(*(None if x is None or name == "context" else fn(x) for name, x in zip(self._fields, self)))

    @staticmethod
    def join(steps: Sequence[StepOutput], combine: Callable[[list], Tensor] = torch.cat) -> StepOutput:
        """Several outputs field by field, ``combine`` (torch.cat: rows after rows) of each field's
        tensors; c and context, which only the next step reads, are left out."""
        return StepOutput(
            *(
                None if column[0] is None or name in ("c", "context") else combine(list(column))
                for name, column in zip(StepOutput._fields, zip(*steps))
            )
        )


def lstm_update(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 1-3 from the gates' pre-activations (N, 4H), in the order i, f, g, o: c_t = f c_{t-1} + i g,
    h_t = o tanh(c_t). Returns h_t, c_t (N, H)."""
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class Attend:
    """alpha_t, its glimpse and the gated context z_t from a hidden state h (Eq. 4-5, 13; Section
    4.2.1): every score function, several heads (their contexts joined and projected to D by W_o),
    the local window (a predicted centre and a Gaussian window over the grid), and Attention on
    Attention (Huang et al. 2019; ``aoa``): the context v^ replaced by i * g, the information
    i = W_i [v^; h] + b_i and the gate g = sigmoid(W_g [v^; h] + b_g), before beta_t's gate, where h
    is the state the cell attends from (h_{t-1} for Bahdanau, h_t for Luong).

    The cell computes what attention needs from h in its fused product, ``from_h`` (N, width) =
    [query (W_h h; none where the query is h itself) | f_beta(h) (1) | W_p h (the local centre's; none
    when global)], of widths :attr:`widths`."""

    def __init__(
        self,
        f_att: Score,
        local_centre: LocalCentre | None,
        head_proj: nn.Linear | None,
        local_sigma: float,
        aoa: nn.Linear | None = None,
    ):
        self.f_att, self.local_centre, self.head_proj, self.local_sigma = f_att, local_centre, head_proj, local_sigma
        self.aoa = aoa
        self.widths = [f_att.query_dim, 1, 0 if local_centre is None else local_centre.v_p.in_features]
        self.width = sum(self.widths)

    def __call__(
        self,
        from_h: Tensor,
        h: Tensor,
        state: DecoderState,
        mode: str,
        use_expected: Tensor | None = None,
        location: Tensor | None = None,
        temperature: float = 1.0,
        graph_safe: bool = False,
        beams: int | None = None,
    ) -> tuple[Glimpse, Tensor, Tensor]:
        """from_h (N, width), h (N, H) over the images of ``state`` (features (B, L, D), projected),
        ``beams`` = N / B rows per image (default state.beams). Returns the glimpse, beta (N,), z (N, D)."""
        beams = state.beams if beams is None else beams
        Q = self.widths[0]
        bias = None
        if self.local_centre is not None:
            gh, gw = grid_shape(state.features.size(1))
            bias = window_log(self.local_centre(from_h[:, Q + 1 :], gh, gw), gh, gw, self.local_sigma)  # (N, L)
        if state.bias is not None:  # a prior over the locations, per image: (B, L) -> (N, L)
            prior = state.bias if beams == 1 else state.bias.repeat_interleave(beams, 0)
            bias = prior if bias is None else bias + prior
        alpha = self.f_att(state.projected, from_h[:, :Q] if Q else h, beams, bias=bias)  # (N, L) or (N, heads, L)
        g = glimpse(
            alpha,
            state.features,
            mode,
            use_expected,
            location=location,
            beams=beams,
            temperature=temperature,
            graph_safe=graph_safe,
        )
        context = g.context if self.head_proj is None else self.head_proj(g.context)  # (N, D)
        if self.aoa is not None:  # Attention on Attention: i * sigmoid(g), both from [context; h] (N, D + H)
            context = F.glu(self.aoa(torch.cat([context, h], -1)), -1)
        beta = torch.sigmoid(from_h[:, Q])  # (N,): the gating scalar
        return g, beta, beta.unsqueeze(1) * context


class BahdanauCell:
    """The paper's step: alpha_t from h_{t-1}, z_t, then the LSTM on [E y_{t-1}; h_{t-1}; z_t].

    Every product of h_{t-1} is one matrix, ``from_hidden`` = [attention's (:class:`Attend`) | the
    LSTM's recurrent weights (4H)]; the embedding's share of the gates is computed for all steps
    before a loop (:meth:`inputs`)."""

    #: the LSTM reads z_t, so the steps run one after the other
    whole_sequence = False

    def __init__(self, from_hidden: nn.Linear, embed_gates: nn.Linear, context_gates: nn.Linear, attend: Attend):
        self.from_hidden, self.embed_gates, self.context_gates, self.attend = (
            from_hidden,
            embed_gates,
            context_gates,
            attend,
        )
        self.splits = [attend.width, context_gates.out_features]  # (attention's products, 4H)

    def inputs(self, embedded: Tensor) -> Tensor:
        """The step's input from E y_{t-1} (..., M): the embedding's share of the gates (..., 4H)."""
        return self.embed_gates(embedded)

    def layers(self) -> tuple:
        """The products a teacher-forced pass repeats at every step, with one weight-gradient product
        each (deferred.py); give them to :meth:`step` as ``layers``."""
        return deferred_linear(self.from_hidden), deferred_linear(self.context_gates)

    def step(
        self,
        x: Tensor,
        state: DecoderState,
        mode: str,
        use_expected: Tensor | None = None,
        location: Tensor | None = None,
        temperature: float = 1.0,
        graph_safe: bool = False,
        layers: tuple | None = None,
    ) -> StepOutput:
        """One step: x (N, 4H) from :meth:`inputs`, the state of N rows -> h_t, c_t, z_t, the glimpse.
        ``layers``: (from_hidden, context_gates) as :meth:`layers` gives them (default the layers)."""
        from_hidden, context_gates = layers or (self.from_hidden, self.context_gates)
        from_h, h_gates = from_hidden(state.h).split(self.splits, dim=1)  # (N, H) -> (N, width), (N, 4H)
        g, beta, z = self.attend(from_h, state.h, state, mode, use_expected, location, temperature, graph_safe)
        h, c = lstm_update(x + h_gates + context_gates(z), state.c)  # Eq. 1-3
        return StepOutput.of(h, c, z, beta, g)

    def readout(self, h: Tensor, z: Tensor) -> Tensor:
        """The state the deep output reads: h_t itself."""
        return h


class LuongCell:
    """Luong placement: the LSTM on E y_{t-1}, then alpha_t from h_t, z_t, and the attentional state
    h~_t = tanh(W_c [z_t; h_t]) in h_t's place in the deep output. Attention does not feed the
    recurrence, so a teacher-forced pass runs nn.LSTM over all steps at once (:meth:`sequence`) and
    attends for all of them in batched products (:meth:`attend_steps`)."""

    whole_sequence = True

    def __init__(self, lstm: nn.LSTM, from_output: nn.Linear, combine: nn.Linear, attend: Attend):
        self.lstm, self.from_output, self.combine, self.attend = lstm, from_output, combine, attend

    def inputs(self, embedded: Tensor) -> Tensor:
        """The step's input: E y_{t-1} itself (..., M)."""
        return embedded

    def layers(self) -> None:
        return None

    def step(
        self,
        x: Tensor,
        state: DecoderState,
        mode: str,
        use_expected: Tensor | None = None,
        location: Tensor | None = None,
        temperature: float = 1.0,
        graph_safe: bool = False,
        layers: tuple | None = None,
    ) -> StepOutput:
        """One step: x (N, M) = E y_{t-1}, the state of N rows -> h_t, c_t, z_t, the glimpse."""
        lstm = self.lstm
        gates = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0) + F.linear(state.h, lstm.weight_hh_l0, lstm.bias_hh_l0)
        h, c = lstm_update(gates, state.c)
        g, beta, z = self.attend(self.from_output(h), h, state, mode, use_expected, location, temperature, graph_safe)
        return StepOutput.of(h, c, z, beta, g)

    def sequence(self, embedded: Tensor, state: DecoderState) -> Tensor:
        """h_t of every step: nn.LSTM (cuDNN on a GPU, oneDNN on the CPU) over E y (B, T, M) from
        state's h_0, c_0 -> (B, T, H)."""
        hs, _ = self.lstm(embedded, (state.h.unsqueeze(0).contiguous(), state.c.unsqueeze(0).contiguous()))
        return hs

    def attend_steps(
        self,
        hs: Tensor,
        state: DecoderState,
        mode: str,
        use_expected: Tensor | None = None,
        locations: Tensor | None = None,
        temperature: float = 1.0,
        graph_safe: bool = False,
        from_h: Tensor | None = None,
    ) -> StepOutput:
        """Attention for all T steps of n images in one batched product: the T steps of an image are T
        "beams" over its features. hs (n, T, H), state: the n images' features; use_expected (n,),
        locations (n, T[, heads]); ``from_h`` (n, T, width): from_output(hs), where the caller made it
        for more rows at once. Returns the n * T rows, image-major (c is None)."""
        n, T = hs.shape[:2]
        h = hs.reshape(n * T, -1)
        from_h = self.from_output(h) if from_h is None else from_h.reshape(n * T, -1)
        g, beta, z = self.attend(
            from_h,
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

    def readout(self, h: Tensor, z: Tensor) -> Tensor:
        """The state the deep output reads: h~_t = tanh(W_c [z_t; h_t]), (N, D), (N, H) -> (N, H)."""
        return torch.tanh(self.combine(torch.cat([z, h], dim=-1)))
