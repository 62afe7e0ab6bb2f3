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

models/reference.py writes this model plainly, equation by equation, and is the tests' oracle.
The fast code is in four files: this one holds the layers (their names are the checkpoints' keys),
the initial state, the deep output and the entry points (:meth:`ShowAttendTellDecoder.forward`, a
teacher-forced pass; :meth:`~ShowAttendTellDecoder.step`, one generation step); cells.py the time
step, one cell per placement, and what it gives (StepOutput); unroll.py the teacher-forced
unrollings of the step (the shrinking batch, Luong's whole-sequence pass, static shapes,
scheduled sampling); attention.py the score functions and glimpses.

What makes it fast, apart from the equations (each computes the same function):

- done once, not per step: the image-side attention projection W_a a (``Score.project``) and the
  embedding's share of the LSTM gates, for all steps before the loop;
- fused products: the products of h_{t-1} (W_h, f_beta, the LSTM's recurrent weights) are one
  matrix, ``from_hidden`` (one matrix product per step instead of three);
- the shrinking batch: the captions sorted by length, only those still running take part in a step,
  and the output layer runs once, after the loop, over the real (non-padded) steps (unroll.py);
- one weight gradient per repeated product (deferred.py: fewer, larger matrix products backward);
- the additive score in its sigmoid form and chunked on the CPU (attention.py, section "Speed").

Decoder kinds are registered in :data:`DECODERS` (``DecoderConfig.kind``): this LSTM is "lstm".

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

import importlib
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.models import unroll
from captioning.models.attention import ATTENTION_MODES, SCORES, Glimpse, LocalCentre, build_attention
from captioning.models.cells import Attend, BahdanauCell, DecoderState, LuongCell
from captioning.models.multihead import MultiHeadAttention
from captioning.models.unroll import DecoderOutput
from captioning.registry import Registry
from captioning.vocab import Vocabulary

__all__ = [
    "DECODERS",
    "DecoderConfig",
    "DecoderOutput",
    "DecoderState",
    "ShowAttendTellDecoder",
    "TRAINING_MODES",
    "build_decoder",
    "list_decoders",
]

#: The decoder kinds, by the name ``DecoderConfig.kind`` gives. A kind is an ``nn.Module`` built as
#: ``cls(vocab_size, feature_dim, config)`` with ``forward`` (a teacher-forced pass -> DecoderOutput),
#: ``initial_state``, ``step`` (one generation step), ``vocab_size`` and ``bad_ending_ids``, as
#: :class:`ShowAttendTellDecoder` ("lstm") has them.
DECODERS: Registry[type[nn.Module]] = Registry("decoder kind", field="model.decoder.kind")


#: built-in decoder kinds of their own modules, registered when first named (their modules import
#: this one, so this one cannot import them at its top): kind -> module
BUILT_IN_KINDS = {"transformer": "captioning.models.transformer"}


def load_built_in_kinds() -> None:
    """Import the modules of the built-in decoder kinds (each registers itself in :data:`DECODERS`)."""
    for module in BUILT_IN_KINDS.values():
        importlib.import_module(module)


def list_decoders() -> list[str]:
    """The names of the registered decoder kinds (``DecoderConfig.kind``'s choices)."""
    load_built_in_kinds()
    return DECODERS.names()


#: attention modes of a teacher-forced training pass only: "gumbel", straight-through Gumbel-softmax
#: (an alternative to REINFORCE, not the paper's estimator; see objectives/reinforce.py)
TRAINING_MODES = ("gumbel",)

#: the DecoderConfig fields of the transformer alone (None: not given; models/transformer.py)
TRANSFORMER_ONLY = ("layers", "ff_dim", "positions", "tie_embeddings", "max_positions", "attention_layer")


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
            shapes; compiles on first use; tools/benchmarks/benchmark.py --compile measures what it gains).
        score: the attention score function, a name registered in models/attention.py's ``SCORES``
            (``list_scores()``): "additive" is the paper's (Eq. 4).
        heads: attention heads (1: the paper's single alpha per step).
        placement: "bahdanau" (attend from h_{t-1} before the LSTM, the paper) or "luong" (from
            h_t after it, with the attentional state tanh(W_c [z_t; h_t]) in the deep output).
        window: "global" attention over every location, or "local" (a predicted centre and a
            2-D Gaussian window over the grid).
        local_sigma: the local window's standard deviation, in grid cells.
        refiner_layers: Transformer encoder layers over the annotation vectors before decoding (0: none).
        refiner_heads: attention heads of those layers.
        refiner_aoa: the refiner's self-attention with Attention on Attention's output (AoANet's refiner).
        kind: the decoder, a name registered in :data:`DECODERS` (``list_decoders()``): "lstm" is
            the paper's, :class:`ShowAttendTellDecoder` (model files that record no kind hold one);
            "transformer" the Transformer decoder (models/transformer.py), of width ``hidden_dim``
            and ``heads`` heads, whose embeddings are ``hidden_dim`` wide too.
        aoa: Attention on Attention (Huang et al. 2019) on the attended vector: the LSTM's context
            (either placement) and the transformer's cross-attention.
        layers: transformer only (None: 3): decoder layers.
        ff_dim: transformer only (None: 4 x hidden_dim): the feed-forward layers' width.
        positions: transformer only (None: "sinusoidal"): "sinusoidal" or "learned" word positions.
        tie_embeddings: transformer only (None: false): the output layer's weights are the embedding's.
        max_positions: transformer only (None: 64): the learned positions' count, the longest caption
            a model with learned positions reads or writes (and the default cache length).
        attention_layer: transformer only (None: the first): the layer whose cross-attention maps
            decoding returns (the pictures, grounding, the API's maps), or "mean": their mean over
            the layers.
    """

    embed_dim: int = 512
    hidden_dim: int = 512
    attention_dim: int = 512
    dropout: float = 0.5
    attention_kind: Literal["soft", "hard"] = "soft"
    prev2out: bool = True
    ctx2out: bool = True
    compile_step: bool = False
    score: str = "additive"
    heads: int = 1
    placement: Literal["bahdanau", "luong"] = "bahdanau"
    window: Literal["global", "local"] = "global"
    local_sigma: float = 1.5
    refiner_layers: int = 0
    refiner_heads: int = 4
    kind: str = "lstm"
    refiner_aoa: bool = False
    aoa: bool = False
    layers: int | None = None
    ff_dim: int | None = None
    positions: Literal["sinusoidal", "learned"] | None = None
    tie_embeddings: bool | None = None
    max_positions: int | None = None
    attention_layer: int | str | None = None

    def __post_init__(self):
        if self.attention_kind not in ("soft", "hard"):
            raise ConfigError(f"model.decoder.attention_kind: expected 'soft' or 'hard', got {self.attention_kind!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.decoder.dropout: expected a probability in [0, 1), got {self.dropout!r}")
        for field in ("embed_dim", "hidden_dim", "attention_dim", "heads", "refiner_heads"):
            if getattr(self, field) < 1:
                raise ConfigError(f"model.decoder.{field}: expected an integer >= 1, got {getattr(self, field)!r}")
        if self.kind in BUILT_IN_KINDS and self.kind not in DECODERS:
            load_built_in_kinds()
        DECODERS.check(self.kind)
        SCORES.check(self.score)
        for field, choices in (("placement", ("bahdanau", "luong")), ("window", ("global", "local"))):
            if getattr(self, field) not in choices:
                raise ConfigError(
                    f"model.decoder.{field}: expected one of {', '.join(choices)}, got {getattr(self, field)!r}"
                )
        if not (self.local_sigma > 0 and math.isfinite(self.local_sigma)):
            raise ConfigError(
                f"model.decoder.local_sigma: expected a finite number > 0 (grid cells), got {self.local_sigma!r}"
            )
        if self.refiner_layers < 0:
            raise ConfigError(f"model.decoder.refiner_layers: expected an integer >= 0, got {self.refiner_layers!r}")
        if self.refiner_aoa and not self.refiner_layers:
            raise ConfigError("model.decoder.refiner_aoa: an option of the grid refiner; set refiner_layers >= 1")
        check = getattr(DECODERS.get(self.kind), "check_config", None)  # a kind's own checks
        if check is not None:
            check(self)
        elif self.kind == "lstm":
            for name in TRANSFORMER_ONLY:
                if getattr(self, name) is not None:
                    raise ConfigError(
                        f"model.decoder.{name}: a transformer option; this decoder is kind 'lstm' "
                        f"(set kind: transformer, or remove {name})"
                    )

    @property
    def variant(self) -> str:
        """A short name of the variant ("additive" for the paper's model; another decoder kind leads the name)."""
        if self.kind == "transformer":
            return "+".join(
                [f"transformer{self.layers or 3}"]
                + ([f"{self.heads}heads"] if self.heads > 1 else [])
                + (["aoa"] if self.aoa else [])
                + ([f"refiner{self.refiner_layers}"] if self.refiner_layers else [])
            )
        parts = (
            ([self.kind] if self.kind != "lstm" else [])
            + [self.score]
            + ([f"{self.heads}heads"] if self.heads > 1 else [])
            + (["luong"] if self.placement == "luong" else [])
            + (["local"] if self.window == "local" else [])
            + ([f"refiner{self.refiner_layers}"] if self.refiner_layers else [])
            + (["aoarefiner"] if self.refiner_aoa else [])
            + (["aoa"] if self.aoa else [])
        )
        return "+".join(parts)


@DECODERS.register("lstm")
class ShowAttendTellDecoder(nn.Module):
    """Attention LSTM decoder with soft or hard attention over annotation vectors of width D
    (``feature_dim``), writing words of a vocabulary of V = ``vocab_size`` tokens.

    It holds the layers (their names are the checkpoints' keys) and the step of its placement,
    :attr:`cell` (cells.py); :meth:`forward` unrolls the step over a batch of captions
    (unroll.py), :meth:`step` takes one generation step."""

    def __init__(self, vocab_size: int, feature_dim: int, config: DecoderConfig | None = None):
        super().__init__()
        config = config if config is not None else DecoderConfig()
        embed_dim, hidden_dim, attention_dim = config.embed_dim, config.hidden_dim, config.attention_dim
        self.config = config
        self.attention_kind = config.attention_kind
        self.vocab_size, self.hidden_dim, self.attention_dim = vocab_size, hidden_dim, attention_dim
        self.prev2out = config.prev2out
        #: the token ids after which EOS may be forbidden (``GenerationConfig.forbid_bad_endings``):
        #: set from the vocabulary by ShowAttendTell (the decoder does not know its words); None: unknown
        self.bad_ending_ids: tuple[int, ...] | None = None
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
        self.head_proj = (
            nn.Linear(config.heads * feature_dim, feature_dim, bias=False) if config.heads > 1 else None
        )  # W_o
        self.refiner = (
            GridRefiner(feature_dim, config.refiner_layers, config.refiner_heads, config.dropout, config.refiner_aoa)
            if config.refiner_layers
            else None
        )
        # Attention on Attention: [W_i; W_g] over [context; h] (made last: the other layers draw as before)
        self.aoa = nn.Linear(feature_dim + hidden_dim, 2 * feature_dim) if config.aoa else None
        attend = Attend(self.f_att, self.local_centre, self.head_proj, config.local_sigma, self.aoa)
        #: the time step (cells.py), holding the layers above
        self.cell = (
            LuongCell(self.lstm, self.from_output, self.combine, attend)
            if self.luong
            else BahdanauCell(self.from_hidden, self.embed_gates, self.context_gates, attend)
        )
        #: the step every pass calls: the cell's, or with ``compile_step`` its torch.compile (dynamic
        #: shapes: the number of running captions shrinks from step to step)
        self.cell_step = torch.compile(self.cell.step, dynamic=True) if config.compile_step else self.cell.step

    # ------------------------------------------------------------------ building blocks
    def initial_state(self, features: Tensor, max_steps: int | None = None) -> DecoderState:
        """h_0, c_0 from the mean annotation vector; W_a a once (and the refiner). features: (B, L, D).
        ``max_steps`` (the search's length) sizes a decoder's cache; the LSTM has none."""
        if self.refiner is not None:
            features = self.refiner(features)
        h0, c0 = torch.tanh(self.init_state(self.dropout(features.mean(1)))).chunk(2, dim=-1)  # (B, D) -> 2 x (B, H)
        return DecoderState(h0, c0, features, self.f_att.project(features))

    def deep_output(self, embedded: Tensor, h: Tensor, z: Tensor) -> Tensor:
        """Eq. 7 as in the authors' code: L_o(tanh(E y_{t-1} + L_h h_t + L_z z_t)) with dropout: (N, M), (N, H), (N, D) -> (N, V).
        h: the state the cell's ``readout`` gives (Luong: the attentional state)."""
        x = self.out_hidden(self.dropout(h))
        if self.prev2out:
            x = x + embedded
        if self.out_context is not None:
            x = x + self.out_context(z)
        return self.out_logits(self.dropout(torch.tanh(x)))

    def _mode(self, mode: str | None) -> str:
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
        mode: str | None = None,
        use_expected: Tensor | None = None,
        locations: Tensor | None = None,
        temperature: float = 1.0,
        static: bool = False,
        sample_prob: float = 0.0,
    ) -> DecoderOutput:
        """A teacher-forced pass (unroll.py).

        features: (B, L, D); captions: (B, T + 1) as [BOS, w_1, ..., EOS, PAD...];
        lengths: (B,) tokens per caption including BOS and EOS. Step t reads captions[:, t] and
        predicts captions[:, t + 1]. mode: for hard attention "sample" (training), "expected" or
        "argmax"; use_expected (B,) bool marks rows that take the expected context while sampling;
        ``locations`` (B, T) replaces the samples by given locations (to enumerate them exactly).
        mode "gumbel" samples by straight-through Gumbel-softmax at ``temperature`` (training only).
        ``static``: the static-shape pass (:func:`unroll.static`: every row at every step, nothing
        read back to the host, for CUDA graphs; logits (B, T, V)); otherwise the cell's default,
        the shrinking batch (Bahdanau) or the whole-sequence pass (Luong).
        ``sample_prob`` > 0: scheduled sampling (:func:`unroll.scheduled`): each step reads, with this
        probability per caption, the word sampled from the previous step's output instead of the
        caption's (soft attention, either placement); logits (B, T, V).
        """
        mode = self._mode(mode)
        if sample_prob > 0:
            if self.attention_kind != "soft":
                raise ConfigError(
                    "model.objective.scheduled_sampling_start: scheduled sampling trains soft attention only"
                )
            return unroll.scheduled(self, features, captions, lengths, sample_prob)
        if static:
            run = unroll.static
        else:
            run = unroll.whole_sequence if self.cell.whole_sequence else unroll.packed
        return run(self, features, captions, lengths, mode, use_expected, locations, temperature)

    # ------------------------------------------------------------------ generation
    def step(
        self, tokens: Tensor, state: DecoderState, mode: str | None = None, attention_temperature: float = 1.0
    ) -> tuple[Tensor, DecoderState, Glimpse]:
        """One generation step: previous tokens (N,) -> log p(y_t) (N, V), the new state, the glimpse.

        ``attention_temperature``: a hard-attention model in mode "expected" takes the expected
        context under softmax(log alpha / tau) (see :func:`glimpse`); soft models ignore it.
        log p is computed in the model's precision, at least float32 (float32 under bf16 autocast)."""
        embedded = self.embedding(tokens)  # (N, M)
        mode = self._mode(mode)
        tau = attention_temperature if self.attention_kind == "hard" and mode == "expected" else 1.0
        out = self.cell_step(self.cell.inputs(embedded), state, mode, temperature=tau)
        logits = self.deep_output(embedded, self.cell.readout(out.h, out.z), out.z)  # (N, V)
        log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        return log_probs, state.with_recurrent(out.h, out.c), out.glimpse


def build_decoder(vocab_size: int, feature_dim: int, config: DecoderConfig) -> nn.Module:
    """The decoder of the kind ``config.kind`` names (:data:`DECODERS`)."""
    return DECODERS.get(config.kind)(vocab_size, feature_dim, config)


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
    layers (pre-norm, feed-forward 2D) over a_i + pos(row_i, col_i). (B, L, D) -> (B, L, D).
    ``aoa``: AoANet's refiner (Huang et al. 2019): each layer's self-attention output is Attention
    on Attention's, i * sigmoid(g) from [v^; a] (:class:`AoARefinerLayer`)."""

    def __init__(self, dim: int, layers: int, heads: int, dropout: float, aoa: bool = False):
        super().__init__()
        if dim % heads:
            raise ConfigError(
                f"model.decoder.refiner_heads: the feature width ({dim}) must be a multiple of refiner_heads ({heads})"
            )
        if aoa:
            self.layers = nn.Sequential(*(AoARefinerLayer(dim, heads, dropout) for _ in range(layers)))
        else:
            layer = nn.TransformerEncoderLayer(
                dim, heads, dim_feedforward=2 * dim, dropout=dropout, batch_first=True, norm_first=True
            )
            self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, features: Tensor) -> Tensor:
        gh, gw = grid_shape(features.size(1))
        pos = grid_position_embedding(gh, gw, features.size(-1), features.device, features.dtype)
        return self.layers(features + pos)


class AoARefinerLayer(nn.Module):
    """One layer of the AoA refiner: x + Dropout(AoA-MultiHead(LN(x))), then x + Dropout(FF(LN(x)))
    with FF of width 2D, as the plain refiner's layers. (B, L, D) -> (B, L, D)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.norm_attention, self.attention = nn.LayerNorm(dim), MultiHeadAttention(dim, heads, aoa=True)
        self.norm_ff = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(2 * dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm_attention(x)
        x = x + self.dropout(self.attention(y, self.attention.keys_values(y))[0])
        return x + self.dropout(self.feed_forward(self.norm_ff(x)))
