"""The Show, Attend and Tell decoder (Xu et al. 2015, Sections 3.1.2 and 4), written as its equations.

a (B, L, D) the annotation vectors, E y (M,) a word's embedding, h, c (H,) the LSTM's state:

    h_0, c_0 = tanh(W_init mean_i a_i)                                     initial_state
    e_ti     = w^T tanh(W_a a_i + W_h h_{t-1})                  Eq. 4      AdditiveScore
    alpha_t  = softmax(e_t)                                      Eq. 5      attend
    soft: z_t = sum_i alpha_ti a_i;  hard: s_t ~ Cat(alpha_t), z_t = a_{s_t}   Eq. 13, 8-9   glimpse
    beta_t   = sigmoid(f_beta h_{t-1}),  z_t <- beta_t z_t        Sec. 4.2.1 attend
    i, f, g, o = T [E y_{t-1}; h_{t-1}; z_t]                     Eq. 1      recur
    c_t = sig(f) c_{t-1} + sig(i) tanh(g),  h_t = sig(o) tanh(c_t)   Eq. 2-3    recur
    p(y_t)   = softmax(L_o tanh(E y_{t-1} + L_h h_t + L_z z_t))  Eq. 7      deep_output
    loss     = -log p(y) + lambda sum_i (1 - sum_t alpha_ti)^2   Eq. 14     objectives/cross_entropy.py

The tanh in Eq. 7 and the dropout follow the authors' code. Every default of :class:`DecoderConfig`
is the paper; each variant is a file of models/attention/ named by an option, reached from the
lines marked "variant". captioning/fast/ runs the same function faster (fused products, a
shrinking batch); the tests hold the two equal. Shapes: N = B x beams rows, V words, A attention.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models import ATTENTION_MODES
from captioning.models.kinds import DECODERS
from captioning.registry import Registry
from captioning.vocab import Vocabulary

#: score functions e_ti = score(a_i, h) (``DecoderConfig.score``); the variants in models/attention/
SCORES: Registry[type[Score]] = Registry("attention score", field="model.decoder.score")
#: windows over the grid (``DecoderConfig.window``; "global", the paper's, is none)
WINDOWS: Registry[type[nn.Module]] = Registry("attention window", field="model.decoder.window")
#: where the decoder attends from (``DecoderConfig.placement``): the decoder class of each
PLACEMENTS: Registry[type[ShowAttendTellDecoder]] = Registry("attention placement", field="model.decoder.placement")
#: hard attention's ways of turning alpha_t into a context beyond the paper's three (training estimators)
GLIMPSES: Registry = Registry("attention mode")
#: Eq. 5's normaliser of the scores (``DecoderConfig.normalizer``): "softmax" is the paper's
NORMALIZERS: Registry = Registry("normaliser", field="model.decoder.normalizer")
NORMALIZERS.add("softmax", lambda e: torch.softmax(e, -1))

#: training-only attention modes, registered by the objectives that use them (objectives/gumbel.py)
TRAINING_MODES = ("gumbel",)


def load_variants() -> None:
    """Import the built-in variants (models/attention/), so that their names are registered."""
    importlib.import_module("captioning.models.attention")


@DECODERS.register("lstm")
@dataclass
class DecoderConfig:
    """The LSTM decoder (``kind: lstm``): sizes in the paper's notation, its attention and its variants.

    Args:
        embed_dim: M.  hidden_dim: H.  attention_dim: A, f_att's hidden layer.
        dropout: where the authors' code puts it (0.5 in the paper's runs).
        attention_kind: "soft" (Eq. 13) or "hard" (Eq. 8-12, trained with REINFORCE).
        prev2out, ctx2out: E y_{t-1} and L_z z_t inside the deep output layer (Eq. 7).
        compile_step: ``torch.compile`` the fast path's time step (captioning/fast/).
        score: a name in :data:`SCORES` ("additive", Eq. 4, is the paper's).
        heads: attention heads, their contexts joined by W_o (models/attention/heads.py).
        placement: "bahdanau" attends from h_{t-1} (the paper); "luong" from h_t (attention/luong.py).
        window: "global" (the paper) or a name in :data:`WINDOWS` ("local": attention/local.py;
            "local_p", "local_m": attention/local_p.py; "hierarchical": attention/hierarchical.py).
        local_sigma: the "local" window's width in grid cells.
        local_width: D, the half-width in cells of "local_p" and "local_m" windows (sigma = D / 2).
        region_size: the side in cells of "hierarchical"'s regions.
        normalizer: a name in :data:`NORMALIZERS`: "softmax" (Eq. 5) or "sparsemax" (attention/sparsemax.py).
        normalize: the additive or concat score's v weight-normalised, times a learned g (attention/normalized.py).
        scale: the dot or general score times a learned scalar (attention/scaled.py).
        init: the initial state from the "mean" annotation vector (the paper) or "attention_pool" (attention/pooling.py).
        over_attention: Cui et al.'s attention-over-attention between the words so far and the
            locations (attention/over_attention.py).
        refiner_layers, refiner_heads, refiner_aoa: self-attention over the grid first (attention/refiner.py).
        aoa: Attention on Attention over the context (attention/aoa.py).
        kind: "lstm" (models/kinds.py lists the kinds).
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
    placement: str = "bahdanau"
    window: str = "global"
    local_sigma: float = 1.5
    refiner_layers: int = 0
    refiner_heads: int = 4
    kind: str = "lstm"
    refiner_aoa: bool = False
    aoa: bool = False
    normalizer: str = "softmax"
    normalize: bool = False
    scale: bool = False
    local_width: int = 2
    region_size: int = 2
    init: str = "mean"
    over_attention: bool = False

    def __post_init__(self):
        load_variants()
        if DECODERS.get(self.kind) is not type(self):
            raise ConfigError(
                f"model.decoder.kind: {type(self).__name__} is the config of another kind than {self.kind!r}"
            )
        if self.attention_kind not in ("soft", "hard"):
            raise ConfigError(f"model.decoder.attention_kind: expected 'soft' or 'hard', got {self.attention_kind!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.decoder.dropout: expected a probability in [0, 1), got {self.dropout!r}")
        for name in (
            "embed_dim",
            "hidden_dim",
            "attention_dim",
            "heads",
            "refiner_heads",
            "local_width",
            "region_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.decoder.{name}: expected an integer >= 1, got {getattr(self, name)!r}")
        SCORES.check(self.score)
        PLACEMENTS.check(self.placement)
        NORMALIZERS.check(self.normalizer)
        if self.init not in ("mean", "attention_pool"):
            raise ConfigError(f"model.decoder.init: expected 'mean' or 'attention_pool', got {self.init!r}")
        for option, scores in (("normalize", ("additive", "concat")), ("scale", ("dot", "general"))):
            if getattr(self, option) and self.score not in scores:
                raise ConfigError(
                    f"model.decoder.{option}: an option of the {' and '.join(scores)} scores, not {self.score!r}"
                )
        if self.over_attention and self.placement != "bahdanau":
            raise ConfigError(
                "model.decoder.over_attention: attends from the words so far before the LSTM step; use placement bahdanau"
            )
        if self.window != "global" and self.window not in WINDOWS:
            raise WINDOWS.unknown(self.window, extra="'global'")
        if not (self.local_sigma > 0 and math.isfinite(self.local_sigma)):
            raise ConfigError(
                f"model.decoder.local_sigma: expected a number > 0 (grid cells), got {self.local_sigma!r}"
            )
        if self.refiner_layers < 0:
            raise ConfigError(f"model.decoder.refiner_layers: expected an integer >= 0, got {self.refiner_layers!r}")
        if self.refiner_aoa and not self.refiner_layers:
            raise ConfigError("model.decoder.refiner_aoa: an option of the grid refiner; set refiner_layers >= 1")

    def build(self, vocab_size: int, feature_dim: int) -> ShowAttendTellDecoder:
        """The decoder of this config's placement (its class in :data:`PLACEMENTS`)."""
        if self.over_attention:  # variant: attention/over_attention.py
            return importlib.import_module("captioning.models.attention.over_attention").OverAttentionDecoder(
                vocab_size, feature_dim, self
            )
        return PLACEMENTS.get(self.placement)(vocab_size, feature_dim, self)

    @property
    def variant(self) -> str:
        """A short name of the variant: "additive" for the paper's model."""
        parts = (
            [self.kind] * (self.kind != "lstm")
            + [self.score]
            + [f"{self.heads}heads"] * (self.heads > 1)
            + [self.placement] * (self.placement != "bahdanau")
            + [self.window] * (self.window != "global")
            + [f"refiner{self.refiner_layers}"] * bool(self.refiner_layers)
            + ["aoarefiner"] * self.refiner_aoa
            + ["aoa"] * self.aoa
            + [self.normalizer] * (self.normalizer != "softmax")
            + ["normalized"] * self.normalize
            + ["scaled"] * self.scale
            + [self.init] * (self.init != "mean")
            + ["over_attention"] * self.over_attention
        )
        return "+".join(parts)


@dataclass
class DecoderState:
    """The recurrent state of N rows (images, or images x beams) while decoding."""

    h: Tensor  # (N, H)
    c: Tensor  # (N, H)
    features: Tensor  # (N / beams, L, D): a
    projected: Tensor  # (N / beams, L, K): the score's image side, once per batch (W_a a)
    beams: int = 1  # rows per image: rows k * beams ... (k + 1) * beams - 1 read image k
    bias: Tensor | None = None  # (N / beams, L): a prior added to the scores (decoding/steering.py's focus)
    t: Tensor | None = None  # (N,): the steps taken (a window centred by the step reads it)

    def select(self, index) -> DecoderState:
        """Rows ``index`` of every tensor (one row per image only)."""
        if self.beams != 1:
            raise ValueError("select() needs one row per image; beams share their image's features")
        bias, t = (None if x is None else x[index] for x in (self.bias, self.t))
        return DecoderState(self.h[index], self.c[index], self.features[index], self.projected[index], bias=bias, t=t)

    def with_recurrent(self, h: Tensor, c: Tensor) -> DecoderState:
        """The next step's state: h_t, c_t, one more step taken."""
        t = None if self.t is None else self.t + 1
        return DecoderState(h, c, self.features, self.projected, self.beams, self.bias, t)

    def expand_beams(self, beams: int) -> DecoderState:
        """Each image's (h, c) copied to ``beams`` rows; the features stay one copy per image."""
        if self.beams != 1:
            raise ValueError("expand_beams() of a state that already has beams")
        h, c, t = (None if x is None else x.repeat_interleave(beams, 0) for x in (self.h, self.c, self.t))
        return DecoderState(h, c, self.features, self.projected, beams, self.bias, t)


class DecoderStates:
    """How the search loops (decoding/search.py) take a :class:`DecoderState` apart: (h, c) carried
    row by row and reordered with the beams; (features, projected) per image."""

    n_carried, n_constants = 3, 2

    @staticmethod
    def carried(state: DecoderState) -> list[Tensor]:
        return [state.h, state.c, state.t]

    @staticmethod
    def constants(state: DecoderState) -> list[Tensor]:
        return [state.features, state.projected]

    @staticmethod
    def state(carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> DecoderState:
        h, c, t = carried
        return DecoderState(h, c, *constants, beams, t=t)

    @staticmethod
    def reorder(carried: list[Tensor], rows: Tensor) -> list[Tensor]:
        return [x[rows] for x in carried]


@dataclass
class Glimpse:
    """What one attention step gives: the context before the gate and how alpha was used."""

    context: Tensor | None  # (N, D)
    alpha: Tensor  # (N, L): the weights (the heads' mean with several heads)
    location: Tensor  # (N,): the sampled location, or alpha's argmax; (N, heads) for hard multi-head
    log_prob: Tensor | None = None  # (N,): log p(s_t | a) of a sampled location, 0 where the expected context was used
    entropy: Tensor | None = None  # (N,): H[alpha_t], when sampling
    head_alpha: Tensor | None = None  # (N, heads, L) with several heads
    #: what the pictures may show beside alpha (N, ...) each: "gate" (beta_t), a window's "window"
    views: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class DecoderOutput:
    """A teacher-forced pass over B captions of T + 1 tokens (T steps); zero at padded steps."""

    logits: Tensor  # (B, T, V); the fast path's shrinking batch gives (N, V), the real steps in mask order
    mask: Tensor  # (B, T) bool: the real steps
    alphas: Tensor  # (B, T, L)
    betas: Tensor  # (B, T): beta_t
    locations: Tensor  # (B, T), or (B, T, heads) for hard multi-head
    location_log_probs: Tensor | None = None  # (B, T): log p(s_t | a), when sampling
    entropies: Tensor | None = None  # (B, T): H[alpha_t], when sampling
    head_alphas: Tensor | None = None  # (B, T, heads, L) with several heads

    @property
    def step_logits(self) -> Tensor:
        """The real steps' logits (N, V), in mask.nonzero() order, whichever shape ``logits`` has."""
        return self.logits[self.mask] if self.logits.dim() == 3 else self.logits


class Score(nn.Module):
    """A score function's contract: ``project(a)`` once per batch, ``query(h)`` and ``scores(...)``
    each step. A subclass is built as ``cls(feature_dim, hidden_dim, attention_dim, heads)`` and
    registered with ``@SCORES.register("name")`` (docs/CONTRIBUTING.md has a worked example)."""

    heads: int = 1

    def project(self, features: Tensor) -> Tensor:
        """The image side, once per batch: (B, L, D) -> (B, L, K)."""
        raise NotImplementedError

    def query(self, h: Tensor) -> Tensor:
        """The state side, each step: (N, H) -> (N, Q); h itself unless a subclass projects it."""
        return h

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        """e_t: (N, L), or (N, heads, L); rows k * beams ... (k + 1) * beams - 1 belong to image k."""
        raise NotImplementedError

    def forward(self, projected: Tensor, h: Tensor, beams: int = 1) -> Tensor:
        return self.scores(projected, self.query(h), beams)


@SCORES.register("additive")
class AdditiveScore(Score):
    """Eq. 4, f_att: e_ti = w^T tanh(W_a a_i + W_h h + b). With several heads, head k scores with its
    own A / heads columns and its own w_k (a row of ``w``)."""

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int, heads: int = 1):
        super().__init__()
        if attention_dim % heads:
            raise ConfigError(
                f"model.decoder.heads: attention_dim ({attention_dim}) must be a multiple of heads ({heads})"
            )
        self.heads = heads
        self.W_a = nn.Linear(feature_dim, attention_dim)  # W_a and b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)
        bound = (heads / attention_dim) ** 0.5
        self.w = nn.Parameter(torch.empty(heads, attention_dim // heads).uniform_(-bound, bound))  # (heads, A / heads)

    def project(self, features: Tensor) -> Tensor:
        return self.W_a(features)  # (B, L, A)

    def query(self, h: Tensor) -> Tensor:
        return self.W_h(h)  # (N, A)

    def scores(self, projected: Tensor, query: Tensor, beams: int = 1) -> Tensor:
        B, L, A = projected.shape
        y = torch.tanh(projected.unsqueeze(1) + query.view(B, beams, 1, A))  # (B, beams, L, A)
        e = (y.view(B, beams, L, self.heads, -1) * self.w).sum(-1)  # (B, beams, L, heads)
        return e.view(B * beams, L) if self.heads == 1 else e.transpose(2, 3).reshape(B * beams, self.heads, L)


def per_row(x: Tensor, beams: int) -> Tensor:
    """One image's (B, ...) values repeated for its ``beams`` rows: (B * beams, ...)."""
    return x if beams == 1 else x.repeat_interleave(beams, 0)


def expected_context(alpha: Tensor, features: Tensor, beams: int = 1) -> Tensor:
    """sum_i alpha_ti a_i (Eq. 13): alpha (B * beams, L), features (B, L, D) -> (B * beams, D)."""
    B, L, D = features.shape
    return torch.bmm(alpha.view(B, beams, L), features).view(B * beams, D)


def glimpse(
    alpha: Tensor,
    features: Tensor,
    mode: str = "expected",
    use_expected: Tensor | None = None,
    location: Tensor | None = None,
    beams: int = 1,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Glimpse:
    """alpha_t (N, L) -> the context. "expected" (soft, Eq. 13; ``temperature`` != 1 takes it under
    softmax(log alpha / temperature)); "argmax"; "sample" (hard, Eq. 8-9: s_t ~ Cat(alpha_t), or
    the given ``location``; rows where ``use_expected`` take the expected context, Section 4.1)."""
    if mode not in ATTENTION_MODES:
        return GLIMPSES.get(mode)(alpha, features, use_expected, generator, beams, temperature)
    if mode == "expected":
        weights = alpha if temperature == 1.0 else torch.softmax(alpha.clamp_min(1e-12).log() / temperature, -1)
        return Glimpse(expected_context(weights, features, beams), alpha, alpha.argmax(-1))
    if mode == "argmax":
        location = alpha.argmax(-1)
    elif location is None:
        location = torch.multinomial(alpha.detach().float(), 1, generator=generator).squeeze(-1)  # s_t ~ Cat(alpha_t)
    image = torch.arange(location.size(0), device=location.device) // beams
    context = features[image, location]  # a_{s_t}: (N, D)
    if mode == "argmax":
        return Glimpse(context, alpha, location)
    log_alpha = alpha.clamp_min(1e-12).log()
    log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)  # log p(s_t | a)
    entropy = -(alpha * log_alpha).sum(-1)  # H[alpha_t]
    if use_expected is not None:  # the paper's variance reduction: these rows take the expected context
        context = torch.where(use_expected.unsqueeze(1), expected_context(alpha, features, beams), context)
        log_prob = log_prob.masked_fill(use_expected, 0.0)
    return Glimpse(context, alpha, location, log_prob, entropy)


def lstm_cell(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 2-3 from Eq. 1's pre-activations (N, 4H), gates in the order i, f, g, o -> h_t, c_t (N, H)."""
    i, f, g, o = gates.chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


@PLACEMENTS.register("bahdanau")
class ShowAttendTellDecoder(nn.Module):
    """The paper's decoder: attends from h_{t-1} before the LSTM step. Built as
    ``cls(vocab_size, feature_dim, config)``; ``forward`` is teacher forcing, ``step`` one
    generation step (the search loops of decoding/ call it)."""

    #: the LSTM reads the context z_t (Eq. 1); a placement that attends after it does not
    reads_context = True
    #: a focus prior (``DecoderState.bias``, decoding/steering.py) reaches the scores
    takes_attention_bias = True
    state_layout = DecoderStates

    def __init__(self, vocab_size: int, feature_dim: int, config: DecoderConfig | None = None):
        super().__init__()
        config = config if config is not None else DecoderConfig()
        D, M, H, A = feature_dim, config.embed_dim, config.hidden_dim, config.attention_dim
        self.config, self.attention_kind, self.prev2out = config, config.attention_kind, config.prev2out
        self.vocab_size, self.hidden_dim = vocab_size, H
        #: token ids after which EOS may be forbidden (GenerationConfig.forbid_bad_endings); set by ShowAttendTell
        self.bad_ending_ids: tuple[int, ...] | None = None
        self.E = nn.Embedding(vocab_size, M, padding_idx=Vocabulary.pad_id)
        self.W_init = nn.Linear(D, 2 * H)  # f_init,h and f_init,c side by side
        self.f_att = SCORES.get(config.score)(D, H, A, config.heads)  # Eq. 4
        self.f_beta = nn.Linear(H, 1)
        self.T = nn.Linear(M + H + D * self.reads_context, 4 * H)  # Eq. 1: [E y; h; z] -> i, f, g, o
        self.L_h = nn.Linear(H, M)
        self.L_z = nn.Linear(D, M) if config.ctx2out else None
        self.L_o = nn.Linear(M, vocab_size)
        self.dropout = nn.Dropout(config.dropout)
        self.normalizer = NORMALIZERS.get(config.normalizer)  # Eq. 5's softmax
        variant = importlib.import_module  # the variants' layers (none for the paper), each from its file
        if config.normalize or config.scale:
            score = variant(f"captioning.models.attention.{'normalized' if config.normalize else 'scaled'}")
            self.f_att = score.reweighted(self.f_att)
        self.pool = (
            variant("captioning.models.attention.pooling").AttentionPool(D, A) if config.init != "mean" else None
        )
        self.window = None if config.window == "global" else WINDOWS.get(config.window)(H, A, config, feature_dim=D)
        self.multi_head = (
            variant("captioning.models.attention.heads").MultiHead(D, config.heads) if config.heads > 1 else None
        )
        self.refiner = (
            variant("captioning.models.attention.refiner").refiner(D, config) if config.refiner_layers else None
        )
        self.aoa = variant("captioning.models.attention.aoa").AttentionOnAttention(D, H) if config.aoa else None

    def initial_state(self, features: Tensor, max_steps: int | None = None) -> DecoderState:
        """h_0, c_0 from the mean annotation vector (Section 3.1.2); the score's image side once.
        features (B, L, D); ``max_steps`` sizes other kinds' caches (the LSTM has none)."""
        if self.refiner is not None:  # variant: attention/refiner.py
            features = self.refiner(features)
        pooled = features.mean(1) if self.pool is None else self.pool(features)  # variant: attention/pooling.py
        h0, c0 = torch.tanh(self.W_init(self.dropout(pooled))).chunk(2, dim=-1)
        t = torch.zeros(features.size(0), dtype=torch.long, device=features.device)
        return DecoderState(h0, c0, features, self.f_att.project(features), t=t)

    def attend(self, h: Tensor, state: DecoderState, mode: str, use_expected=None, location=None, temperature=1.0):
        """Eq. 4-5, 13 or 8-9 and the gate (Section 4.2.1) from the state ``h`` (N, H) the placement
        attends from -> (the glimpse, beta_t (N,), z_t (N, D))."""
        e = self.f_att(state.projected, h, state.beams)  # Eq. 4: (N, L), or (N, heads, L)
        if state.bias is not None:  # a prior over the locations, per image
            bias = per_row(state.bias, state.beams)
            e = e + (bias.unsqueeze(1) if e.dim() == 3 else bias)
        if self.window is None:
            alpha, window = self.normalizer(e), None  # Eq. 5
        else:  # variant: a window over the grid (attention/local.py, ...), and what it shows
            alpha, window = self.window(e, h, state, self.normalizer)
        if self.multi_head is None:
            g = glimpse(alpha, state.features, mode, use_expected, location, state.beams, temperature)
        else:  # variant: one context per head, joined by W_o (attention/heads.py)
            g = self.multi_head(alpha, state.features, mode, use_expected, location, state.beams, temperature)
        context = g.context if self.aoa is None else self.aoa(g.context, h)  # variant: attention/aoa.py
        beta = torch.sigmoid(self.f_beta(h))  # (N, 1): the gating scalar
        g.views.update(gate=beta.squeeze(-1), **({} if window is None else {"window": window}))
        return g, beta.squeeze(-1), beta * context

    def recur(self, Ey: Tensor, state: DecoderState, mode: str, use_expected=None, location=None, temperature=1.0):
        """One step of the recurrence from E y_{t-1} (N, M) -> h_t, c_t, z_t, beta_t and the glimpse."""
        g, beta, z = self.attend(state.h, state, mode, use_expected, location, temperature)
        h, c = lstm_cell(self.T(torch.cat([Ey, state.h, z], -1)), state.c)  # Eq. 1-3
        return h, c, z, beta, g

    def deep_output(self, Ey: Tensor, h: Tensor, z: Tensor) -> Tensor:
        """Eq. 7 with the authors' tanh and dropout: (N, M), (N, H), (N, D) -> logits (N, V)."""
        x = self.L_h(self.dropout(h))
        if self.prev2out:
            x = x + Ey
        if self.L_z is not None:
            x = x + self.L_z(z)
        return self.L_o(self.dropout(torch.tanh(x)))

    def attention_mode(self, mode: str | None) -> str:
        """How alpha becomes the context: always "expected" for soft attention; hard's default too."""
        if self.attention_kind == "soft" or mode is None:
            return "expected"
        if mode not in ATTENTION_MODES and mode not in GLIMPSES:
            raise ValueError(f"unknown attention mode {mode!r}; expected one of {ATTENTION_MODES + TRAINING_MODES}")
        return mode

    def forward(self, features, captions, lengths, mode=None, use_expected=None, locations=None, temperature=1.0,
                static=False, sample_prob=0.0) -> DecoderOutput:  # fmt: skip
        """Teacher forcing: features (B, L, D), captions (B, T + 1) as [BOS, w_1, ..., EOS, PAD...],
        lengths (B,) with BOS and EOS; step t reads captions[:, t] and scores captions[:, t + 1].
        Hard attention: ``mode`` "sample" with ``use_expected`` (B,) rows, or given ``locations``
        (B, T). ``sample_prob`` > 0: scheduled sampling. ``static`` changes nothing here (every
        row runs every step); the fast path's passes differ."""
        mode = self.attention_mode(mode)
        if sample_prob > 0 and self.attention_kind != "soft":
            raise ConfigError("model.objective.scheduled_sampling_start: scheduled sampling trains soft attention only")
        B, T = captions.shape[0], captions.size(1) - 1
        mask = torch.arange(T, device=captions.device) < (lengths - 1).clamp(0, T).unsqueeze(1)  # (B, T)
        state, tokens, logits, steps = self.initial_state(features), captions[:, 0], [], []
        for t in range(T):
            if t > 0:
                tokens = captions[:, t]
                if sample_prob > 0:  # scheduled sampling (Bengio et al. 2015): the model's own word
                    sampled = torch.multinomial(torch.softmax(logits[-1].detach().float(), -1), 1).squeeze(1)
                    tokens = torch.where(torch.rand(B, device=tokens.device) < sample_prob, sampled, tokens)
            Ey = self.E(tokens)
            where = None if locations is None else locations[:, t]
            h, c, z, beta, g = self.recur(Ey, state, mode, use_expected, where, temperature)
            state = state.with_recurrent(h, c)
            logits.append(self.deep_output(Ey, h, z))
            steps.append((g.alpha, beta, g.location, g.log_prob, g.entropy, g.head_alpha))

        def stacked(i: int) -> Tensor | None:  # every step's values (B, T, ...), zero at padded steps
            if steps[0][i] is None:
                return None
            x = torch.stack([s[i] for s in steps], 1)
            m = mask.view(B, T, *[1] * (x.dim() - 2))
            return x * m if x.is_floating_point() else x.masked_fill(~m, 0)

        return DecoderOutput(torch.stack(logits, 1), mask, *map(stacked, range(6)))

    def step(self, tokens: Tensor, state: DecoderState, mode: str | None = None, attention_temperature: float = 1.0):
        """One generation step: tokens (N,) -> log p(y_t) (N, V) (at least float32), the new state, the glimpse.
        ``attention_temperature``: a hard model's expected context under softmax(log alpha / tau)."""
        mode = self.attention_mode(mode)
        Ey = self.E(tokens)
        tau = attention_temperature if self.attention_kind == "hard" and mode == "expected" else 1.0
        h, c, z, beta, g = self.recur(Ey, state, mode, temperature=tau)
        logits = self.deep_output(Ey, h, z)
        log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        return log_probs, state.with_recurrent(h, c), g
