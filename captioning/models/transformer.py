"""The Transformer decoder over the annotation grid (Vaswani et al. 2017), ``decoder.kind: transformer``.

N pre-LayerNorm layers of width d (``hidden_dim``) over x_0 = Dropout(sqrt(d) E y + pos(t)):

    x = x + Dropout(SelfAttention(LN(x)))       masked, over the words so far
    x = x + Dropout(CrossAttention(LN(x), m))   from the words to the grid m = LN(W_m a + pos(row, col))
    x = x + Dropout(FF(LN(x)))                  FF(x) = W_2 Dropout(ReLU(W_1 x))
    log p(y_{t+1}) = log_softmax(W_o LN(x_N))   W_o optionally E itself (tied embeddings)

``aoa``: the cross-attention's output is Attention on Attention's, g * i from [v^; q] (Huang et al.
2019). Teacher forcing runs every position at once under the causal mask. Decoding keeps each
layer's self-attention keys and values in a cache of fixed length, written at the step's position
and reordered with the beams like any carried tensor (:class:`TransformerStates`). The maps the
search returns are one layer's cross-attention (``attention_layer``, the first by default) or the
layers' mean, averaged over heads as ``alpha``; each step's word-by-word self-attention weights are its
glimpse's ``views["self"]``. A focus prior reaches every layer's and head's scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.models.attention.refiner import GridRefiner, grid_position_embedding
from captioning.models.decoder import DecoderOutput, Glimpse
from captioning.models.kinds import DECODERS
from captioning.models.multihead import MultiHeadAttention
from captioning.vocab import Vocabulary


@DECODERS.register("transformer")
@dataclass
class TransformerConfig:
    """The Transformer decoder (``kind: transformer``).

    Args:
        hidden_dim: d, the model width (the word embeddings' too).
        heads: attention heads (d must be a multiple).
        layers: decoder layers.
        ff_dim: the feed-forward layers' width (None: 4 d).
        dropout: dropout probability.
        positions: "sinusoidal" or "learned" word positions.
        tie_embeddings: the output layer's weights are the embedding's.
        max_positions: the learned positions' count (the longest caption read or written) and the
            default cache length.
        attention_layer: the layer whose cross-attention maps decoding returns (None: the first), or
            "mean" (their mean over the layers): the pictures, grounding, the API's maps.
        aoa: Attention on Attention on the cross-attention's output (Huang et al. 2019).
        refiner_layers, refiner_heads, refiner_aoa: self-attention over the grid first (attention/refiner.py).
        kind: "transformer".
    """

    hidden_dim: int = 512
    heads: int = 8
    layers: int = 3
    ff_dim: int | None = None
    dropout: float = 0.1
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    tie_embeddings: bool = False
    max_positions: int = 64
    attention_layer: int | str | None = None
    aoa: bool = False
    refiner_layers: int = 0
    refiner_heads: int = 4
    refiner_aoa: bool = False
    kind: str = "transformer"

    #: the transformer attends softly (objectives and decoding read this as the LSTM's field)
    attention_kind = "soft"

    def __post_init__(self):
        if self.kind != "transformer":
            raise ConfigError(f"model.decoder.kind: this config is the transformer's, got {self.kind!r}")
        for name in ("hidden_dim", "heads", "layers", "max_positions", "refiner_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.decoder.{name}: expected an integer >= 1, got {getattr(self, name)!r}")
        if self.ff_dim is not None and self.ff_dim < 1:
            raise ConfigError(f"model.decoder.ff_dim: expected an integer >= 1, got {self.ff_dim!r}")
        if self.refiner_layers < 0:
            raise ConfigError(f"model.decoder.refiner_layers: expected an integer >= 0, got {self.refiner_layers!r}")
        if self.refiner_aoa and not self.refiner_layers:
            raise ConfigError("model.decoder.refiner_aoa: an option of the grid refiner; set refiner_layers >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.decoder.dropout: expected a probability in [0, 1), got {self.dropout!r}")
        if self.positions not in ("sinusoidal", "learned"):
            raise ConfigError(f"model.decoder.positions: expected 'sinusoidal' or 'learned', got {self.positions!r}")
        if self.hidden_dim % self.heads:
            raise ConfigError(
                f"model.decoder.heads: the transformer's width hidden_dim ({self.hidden_dim}) must be a "
                f"multiple of heads ({self.heads})"
            )
        chosen = self.attention_layer
        if (
            chosen is not None
            and chosen != "mean"
            and (isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < self.layers)
        ):
            raise ConfigError(
                f"model.decoder.attention_layer: expected a layer in 0..{self.layers - 1} (the model has "
                f"{self.layers}) or 'mean', got {chosen!r}"
            )

    def build(self, vocab_size: int, feature_dim: int) -> TransformerDecoder:
        return TransformerDecoder(vocab_size, feature_dim, self)

    @property
    def variant(self) -> str:
        """A short name: "transformer3", "+4heads", "+aoa", "+refiner2"."""
        return "+".join(
            [f"transformer{self.layers}"]
            + [f"{self.heads}heads"] * (self.heads > 1)
            + ["aoa"] * self.aoa
            + [f"refiner{self.refiner_layers}"] * bool(self.refiner_layers)
        )


def sinusoids(positions: Tensor, dim: int, dtype=torch.float32) -> Tensor:
    """Vaswani et al.'s position encoding of integer positions (...,) -> (..., dim): sin and cos
    pairs at wavelengths from 2 pi to 10000 x 2 pi."""
    freqs = torch.exp(
        torch.arange(0, dim, 2, device=positions.device, dtype=dtype) * (-math.log(10000.0) / dim)
    )  # (dim / 2,)
    x = positions.to(dtype).unsqueeze(-1) * freqs
    return torch.stack([x.sin(), x.cos()], dim=-1).flatten(-2)[..., :dim]


class DecoderLayer(nn.Module):
    """One pre-LN decoder layer: masked self-attention, cross-attention to the grid, feed-forward."""

    def __init__(self, dim: int, heads: int, ff_dim: int, dropout: float, aoa: bool):
        super().__init__()
        self.norm_self, self.self_attention = nn.LayerNorm(dim), MultiHeadAttention(dim, heads)
        self.norm_cross, self.cross_attention = nn.LayerNorm(dim), MultiHeadAttention(dim, heads, aoa)
        self.norm_ff = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(dim, ff_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_dim, dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        self_kv: Tensor,
        self_mask: Tensor | None,
        memory_kv: Tensor,
        beams: int = 1,
        memory_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, Tq, d) after its self-attention's keys and values ``self_kv`` (N, 2, S, d) under
        ``self_mask``; the grid's ``memory_kv`` (N / beams, 2, L, d): with beams, the queries of an
        image's ``beams`` rows (Tq = 1) attend as one image's queries; ``memory_bias`` (N / beams, L)
        added to every head's cross-attention scores (a focus prior). -> x, the cross weights (N, h, Tq, L)
        and the self-attention weights (N, h, Tq, S), zero where the mask hides a position."""
        a, self_weights = self.self_attention(self.norm_self(x), self_kv, self_mask)
        x = x + self.dropout(a)
        N, Tq, d = x.shape
        y = self.norm_cross(x).reshape(N // beams, beams * Tq, d)  # an image's rows as its queries
        prior = None if memory_bias is None else memory_bias[:, None, None, :]  # (B, 1, 1, L): every head and query
        a, weights = self.cross_attention(y, memory_kv, bias=prior)  # (B, beams * Tq, d), (B, h, beams * Tq, L)
        x = x + self.dropout(a.reshape(N, Tq, d))
        weights = weights.reshape(N // beams, -1, beams, Tq, weights.size(-1)).transpose(1, 2)
        x = x + self.dropout(self.feed_forward(self.norm_ff(x)))
        return x, weights.reshape(N, -1, Tq, weights.size(-1)), self_weights


@dataclass
class TransformerState:
    """A batch of N rows (images, or images x beams) during decoding."""

    position: Tensor  # (N,) long: the position of the word the next step reads
    cache: Tensor  # (N, layers, 2, T, d): each layer's self-attention keys and values of positions < position
    memory: Tensor  # (N / beams, layers, 2, L, d): each layer's cross-attention keys and values of the grid
    beams: int = 1
    #: (N / beams, L) added to every layer's and head's cross-attention scores before the softmax,
    #: per image: a prior over the locations (decoding/steering.py's focus, as DecoderState.bias); None: none
    bias: Tensor | None = None

    def select(self, index: Tensor) -> TransformerState:
        """Rows ``index`` (a slice, or (N',) indices); one row per image only."""
        if self.beams != 1:
            raise ValueError("select() needs one row per image; beams share their image's memory")
        bias = None if self.bias is None else self.bias[index]
        return TransformerState(self.position[index], self.cache[index], self.memory[index], bias=bias)

    def expand_beams(self, beams: int) -> TransformerState:
        """Each image's rows copied to ``beams`` rows; the memory (and prior) stay one copy per image."""
        if self.beams != 1:
            raise ValueError("expand_beams() of a state that already has beams")
        return TransformerState(
            self.position.repeat_interleave(beams, 0),
            self.cache.repeat_interleave(beams, 0),
            self.memory,
            beams,
            self.bias,
        )


class TransformerStates:
    """How the search loops (decoding/search.py) take a :class:`TransformerState` apart: carried
    (position, cache), reordered with the beams row by row; constant per image (memory)."""

    n_carried, n_constants = 2, 1

    @staticmethod
    def carried(state: TransformerState) -> list[Tensor]:
        return [state.position, state.cache]

    @staticmethod
    def constants(state: TransformerState) -> list[Tensor]:
        return [state.memory]

    @staticmethod
    def state(carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> TransformerState:
        return TransformerState(*carried, *constants, beams)

    @staticmethod
    def reorder(carried: list[Tensor], rows: Tensor) -> list[Tensor]:
        return [x[rows] for x in carried]


def teacher_forcing_mask(
    kind: str, captions: Tensor, lengths: Tensor, mode, use_expected, locations, sample_prob: float
) -> Tensor:
    """The (B, T) mask of the real steps of a teacher-forced pass of a decoder that runs every position
    at once and attends softly (the transformer's, the conv decoder's), after refusing in one line what
    only the LSTM trains: scheduled sampling, hard attention's modes and locations."""
    if sample_prob > 0:
        raise ConfigError("model.objective.scheduled_sampling_start: scheduled sampling trains the LSTM decoder only")
    if mode not in (None, "expected") or use_expected is not None or locations is not None:
        raise ConfigError(f"model.decoder.kind: the {kind} decoder attends softly; hard attention is the LSTM's")
    T = captions.size(1) - 1
    steps = (lengths - 1).clamp(min=0, max=T)
    return torch.arange(T, device=captions.device).unsqueeze(0) < steps.unsqueeze(1)


class TransformerDecoder(nn.Module):
    """N pre-LN Transformer decoder layers over the projected annotation grid (module docstring).
    Built as ``cls(vocab_size, feature_dim, config)``; the model width is ``config.hidden_dim``."""

    #: the loops' view of the state (decoding/search.py)
    state_layout = TransformerStates
    #: a focus prior (TransformerState.bias, decoding/steering.py) reaches every layer's and head's
    #: cross-attention scores
    takes_attention_bias = True

    def __init__(self, vocab_size: int, feature_dim: int, config: TransformerConfig | None = None):
        super().__init__()
        config = config if config is not None else TransformerConfig()
        self.config = config
        d = config.hidden_dim
        self.vocab_size, self.hidden_dim, self.heads = vocab_size, d, config.heads
        self.attention_kind = "soft"
        self.num_layers, self.positions, self.max_positions = config.layers, config.positions, config.max_positions
        #: the layer whose cross-attention maps decoding returns (the first by default; "mean": the
        #: mean over the layers)
        self.attention_layer = 0 if config.attention_layer is None else config.attention_layer
        #: the token ids after which EOS may be forbidden: set by ShowAttendTell (as the LSTM's)
        self.bad_ending_ids: tuple[int, ...] | None = None
        self.embedding = nn.Embedding(vocab_size, d, padding_idx=Vocabulary.pad_id)  # E
        # Vaswani et al.'s scale: E ~ N(0, 1/d), so that sqrt(d) E y is of unit size beside the
        # positions and the layers' outputs (torch's N(0, 1) would make the word outweigh the image).
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        with torch.no_grad():
            self.embedding.weight[Vocabulary.pad_id].zero_()
        self.position_embedding = nn.Embedding(self.max_positions, d) if self.positions == "learned" else None
        self.refiner = (
            GridRefiner(feature_dim, config.refiner_layers, config.refiner_heads, config.dropout, config.refiner_aoa)
            if config.refiner_layers
            else None
        )
        self.memory_proj = nn.Linear(feature_dim, d)  # W_m
        self.memory_norm = nn.LayerNorm(d)
        ff_dim = config.ff_dim or 4 * d
        self.layers = nn.ModuleList(
            DecoderLayer(d, config.heads, ff_dim, config.dropout, config.aoa) for _ in range(self.num_layers)
        )
        self.final_norm = nn.LayerNorm(d)
        self.out_logits = nn.Linear(d, vocab_size)
        if config.tie_embeddings:
            self.out_logits.weight = self.embedding.weight
        self.dropout = nn.Dropout(config.dropout)

    # ------------------------------------------------------------------ building blocks
    def memory(self, features: Tensor) -> Tensor:
        """Each layer's cross-attention keys and values of the grid: (B, L, D) -> (B, layers, 2, L, d)."""
        if self.refiner is not None:
            features = self.refiner(features)
        gh, gw = grid_shape(features.size(1))
        pos = grid_position_embedding(gh, gw, self.hidden_dim, features.device, features.dtype)
        m = self.memory_norm(self.memory_proj(features) + pos)  # (B, L, d)
        return torch.stack([layer.cross_attention.keys_values(m) for layer in self.layers], 1)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """x_0 = Dropout(sqrt(d) E y + pos(t)): tokens and positions (...,) -> (..., d)."""
        x = self.embedding(tokens) * math.sqrt(self.hidden_dim)
        if self.position_embedding is not None:  # positions within max_positions: checked by shape (check_length)
            x = x + self.position_embedding(positions)
        else:
            x = x + sinusoids(positions, self.hidden_dim, x.dtype)
        return self.dropout(x)

    def check_length(self, T: int) -> None:
        """A one-line ConfigError if learned positions cannot reach T tokens (from shapes: nothing read
        from the device, so that a captured step stays capturable)."""
        if self.position_embedding is not None and T > self.max_positions:
            raise ConfigError(
                f"model.decoder.max_positions: this model's learned positions end at {self.max_positions}; "
                f"{T} tokens are more (lower max_new_tokens or max_length)"
            )

    def logits(self, x: Tensor) -> Tensor:
        return self.out_logits(self.final_norm(x))

    def initial_state(self, features: Tensor, max_steps: int | None = None) -> TransformerState:
        """The grid's keys and values once, an empty cache of ``max_steps`` positions (default
        max_positions) at position 0. features: (B, L, D)."""
        T = max_steps or self.max_positions
        self.check_length(T)
        memory = self.memory(features)
        B = features.size(0)
        cache = memory.new_zeros(B, self.num_layers, 2, T, self.hidden_dim)
        return TransformerState(torch.zeros(B, dtype=torch.long, device=features.device), cache, memory)

    # ------------------------------------------------------------------ teacher forcing
    def run(self, features: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Every position at once under the causal mask: tokens (B, T) -> logits (B, T, V) and
        every layer's cross-attention weights (B, layers, heads, T, L)."""
        B, T = tokens.shape
        self.check_length(T)
        memory = self.memory(features)
        x = self.embed(tokens, torch.arange(T, device=tokens.device))
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()  # (T, T): position t sees <= t
        maps = []
        for i, layer in enumerate(self.layers):
            x, w, _ = layer(x, layer.self_attention.keys_values(layer.norm_self(x)), causal, memory[:, i])
            maps.append(w)
        return self.logits(x), torch.stack(maps, 1)

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
        """A teacher-forced pass (as the LSTM's ``forward``): features (B, L, D), captions (B, T + 1),
        lengths (B,) with BOS and EOS. Position t reads captions[:, t] and predicts captions[:, t + 1].
        Logits (N, V) of the real steps in mask.nonzero() order, or (B, T, V) with ``static``."""
        mask = teacher_forcing_mask("transformer", captions, lengths, mode, use_expected, locations, sample_prob)
        logits, maps = self.run(features, captions[:, :-1])
        heads = self.chosen_maps(maps.unbind(1)).transpose(1, 2) * mask[:, :, None, None]  # (B, T, h, L)
        alphas = heads.mean(2)
        return DecoderOutput(
            logits=logits if static else logits[mask],
            mask=mask,
            alphas=alphas,
            betas=mask.to(alphas.dtype),
            locations=alphas.argmax(-1) * mask,
            head_alphas=heads if self.heads > 1 else None,
        )

    def chosen_maps(self, maps: Sequence[Tensor]) -> Tensor:
        """Of each layer's cross-attention maps, ``attention_layer``'s, or their mean over the layers
        (summed without stacking them: decoding calls this at every step)."""
        if self.attention_layer == "mean":
            return sum(maps[1:], maps[0]) / len(maps)
        return maps[self.attention_layer]

    # ------------------------------------------------------------------ generation
    def step(
        self, tokens: Tensor, state: TransformerState, mode: str | None = None, attention_temperature: float = 1.0
    ) -> tuple[Tensor, TransformerState, Glimpse]:
        """One decoding step: previous tokens (N,) -> log p (N, V), the state with this position's
        keys and values in the cache, the glimpse (``alpha`` (N, L) the heads' mean of
        ``attention_layer``, ``head_alpha`` (N, heads, L); ``views["self"]`` (N, layers, heads, T):
        every layer's and head's weights over the positions read so far, zero at the cache's later
        positions). ``mode`` and ``attention_temperature`` are hard attention's (ignored)."""
        N = tokens.size(0)
        T = state.cache.size(3)
        x = self.embed(tokens, state.position).unsqueeze(1)  # (N, 1, d)
        here = torch.arange(T, device=tokens.device) == state.position.unsqueeze(1)  # (N, T)
        seen = (torch.arange(T, device=tokens.device) <= state.position.unsqueeze(1)).view(N, 1, 1, T)
        caches, maps, words = [], [], []
        for i, layer in enumerate(self.layers):
            new = layer.self_attention.keys_values(layer.norm_self(x))  # (N, 2, 1, d)
            kv = torch.where(here.view(N, 1, T, 1), new, state.cache[:, i])  # written at the position
            x, w, s = layer(x, kv, seen, state.memory[:, i], state.beams, state.bias)
            caches.append(kv)
            maps.append(w[:, :, 0])  # (N, h, L)
            words.append(s[:, :, 0])  # (N, h, T): this position's weights over the positions so far
        logits = self.logits(x[:, 0])
        log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        heads = self.chosen_maps(maps)
        alpha = heads.mean(1)
        new_state = TransformerState(state.position + 1, torch.stack(caches, 1), state.memory, state.beams, state.bias)
        return (
            log_probs,
            new_state,
            Glimpse(
                None,
                alpha,
                alpha.argmax(-1),
                head_alpha=heads if self.heads > 1 else None,
                views={"self": torch.stack(words, 1)},  # (N, layers, heads, T): the word-by-word view
            ),
        )


def transformer_members(model) -> list:
    """The models of ``model`` (itself, or an Ensemble's members) whose decoder has layers of maps to
    choose from (``chosen_maps``: a transformer, a conv decoder, models/conv.py); [] for an LSTM."""
    return [m for m in getattr(model, "members", [model]) if hasattr(getattr(m, "decoder", None), "chosen_maps")]


def attention_layer_field(model) -> dict:
    """``{"attention_layer": L}``: the layer whose cross-attention maps ``model`` returns (a number, or
    "mean"; an ensemble's first transformer member's), for descriptions and reports; {} without one."""
    transformers = transformer_members(model)
    return {"attention_layer": transformers[0].decoder.attention_layer} if transformers else {}


def choose_attention_layer(model, layer: int | str | None, option: str = "--layer"):
    """``model`` (a ShowAttendTell, or an Ensemble: each transformer member) returning the
    cross-attention maps of ``layer`` ("mean": their mean over the layers) from now on (None: as it
    is); chosen once, before decoding (its spec says so as ``decoder.attention_layer``). One-line ConfigError naming ``option`` for a
    layer the model does not have, or a model without transformer members."""
    if layer is None:
        return model
    import dataclasses

    members = list(getattr(model, "members", [model]))
    transformers = transformer_members(model)
    if not transformers:
        raise ConfigError(
            f"{option}: chooses a transformer decoder's layer; this model's decoder is kind "
            f"{members[0].decoder.config.kind!r} (one attention map per word)"
        )
    for m in transformers:
        n = m.decoder.num_layers
        if layer != "mean" and (not isinstance(layer, int) or not -n <= layer < n):
            raise ConfigError(
                f"{option}: expected a layer in 0..{n - 1} (the model has {n} layers) or 'mean', got {layer}"
            )
        chosen = layer if layer == "mean" else layer % n
        m.decoder.config = dataclasses.replace(m.decoder.config, attention_layer=chosen)
        m.decoder.attention_layer = chosen
        if getattr(m, "spec", None) is not None:
            m.spec = dataclasses.replace(m.spec, decoder=m.decoder.config)
    return model
