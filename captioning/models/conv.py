"""ConvS2S's convolutional decoder with multi-step attention (Gehring et al. 2017), ``decoder.kind: conv``.

One width d (``hidden_dim``). Words y_0 = BOS, y_1, ... and the grid's annotation vectors a_j (L, D):

    g_i     = Dropout(E y_i + P_i)                          learned word and position embeddings   embed
    z_j     = W_z a_j + b_z                                 the grid's "encoder output" (keys)    memory
    e_j     = W_e a_j + b_e + pos(row_j, col_j)             its "input embedding" (2-D positions)  memory
    x^0_i   = g_i;  for each layer l = 1..n:
    h^l_i   = GLU(W^l [x^{l-1}_{i-k+1}; ...; x^{l-1}_i] + b^l)   causal convolution, zeros before y_0  ConvLayer
    d^l_i   = W_d^l h^l_i + b_d^l + g_i                                                                ConvLayer
    a^l_ij  = softmax_j(d^l_i . z_j)                        every layer attends (multi-step)         ConvLayer
    c^l_i   = sum_j a^l_ij (z_j + e_j)                                                                ConvLayer
    x^l_i   = sqrt(0.5) (h^l_i + c^l_i + x^{l-1}_i)         c added to the layer's output; residual   ConvLayer
    log p(y_{i+1}) = log_softmax(W_o Dropout(x^n_i) + b_o)

GLU(A; B) = A * sigmoid(B). The grid plays the source sentence: z_j is its projection to the width
and e_j, as ConvS2S's w_j + p_j, its own embedding plus the cell's 2-D sinusoidal position
(attention/refiner.py), so that the values say where the keys matched. Teacher forcing runs every
position at once (left padding); decoding keeps each layer's last k - 1 inputs (:class:`ConvState`).
The maps decoding returns are ``attention_layer``'s (the first by default) or the layers' mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.errors import ConfigError
from captioning.models.attention.refiner import grid_position_embedding
from captioning.models.decoder import DecoderOutput, Glimpse
from captioning.models.kinds import DECODERS
from captioning.models.transformer import teacher_forcing_mask
from captioning.vocab import Vocabulary


@DECODERS.register("conv")
@dataclass
class ConvConfig:
    """The convolutional decoder with multi-step attention (``kind: conv``).

    Args:
        hidden_dim: d, the width of the embeddings, the convolutions and the attention.
        layers: convolutional layers, each with its own attention over the grid.
        kernel_size: k, the words each convolution reads (its own and the k - 1 before it); n
            layers see 1 + n (k - 1) words.
        dropout: dropout probability (the embeddings, each convolution's input, the output layer's).
        max_positions: the learned positions' count (the longest caption read or written).
        attention_layer: the layer whose maps decoding returns (None: the first), or "mean" (their
            mean over the layers): the pictures, grounding, the API's maps.
        kind: "conv".
    """

    hidden_dim: int = 512
    layers: int = 3
    kernel_size: int = 3
    dropout: float = 0.1
    max_positions: int = 64
    attention_layer: int | str | None = None
    kind: str = "conv"

    #: the convolutional decoder attends softly (objectives and decoding read this as the LSTM's field)
    attention_kind = "soft"

    def __post_init__(self):
        if self.kind != "conv":
            raise ConfigError(f"model.decoder.kind: this config is the conv decoder's, got {self.kind!r}")
        for name in ("hidden_dim", "layers", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.decoder.{name}: expected an integer >= 1, got {getattr(self, name)!r}")
        if self.kernel_size < 2:
            raise ConfigError(
                f"model.decoder.kernel_size: expected an integer >= 2 (a kernel of 1 reads no earlier word), "
                f"got {self.kernel_size!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.decoder.dropout: expected a probability in [0, 1), got {self.dropout!r}")
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

    def build(self, vocab_size: int, feature_dim: int) -> ConvDecoder:
        return ConvDecoder(vocab_size, feature_dim, self)

    @property
    def variant(self) -> str:
        """A short name: "conv3+k3"."""
        return f"conv{self.layers}+k{self.kernel_size}"


def init_linear(layer: nn.Module, gain: float, dropout: float) -> None:
    """ConvS2S's initialisation (Section 3.5): weights N(0, gain (1 - p) / fan-in) in variance, so that
    a layer keeps its input's variance under dropout p (gain 4 before a GLU, which halves it twice);
    biases 0."""
    fan_in = layer.weight[0].numel()
    nn.init.normal_(layer.weight, std=math.sqrt(gain * (1.0 - dropout) / fan_in))
    nn.init.zeros_(layer.bias)


class ConvLayer(nn.Module):
    """One decoder layer l: the causal convolution and its GLU, its own attention over the grid, the
    scaled residual (module docstring)."""

    def __init__(self, dim: int, kernel_size: int, dropout: float):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(dim, 2 * dim, kernel_size)  # W^l, b^l: (2d, d, k)
        self.W_d = nn.Linear(dim, dim)  # W_d^l, b_d^l
        init_linear(self.conv, 4.0, dropout)
        init_linear(self.W_d, 1.0, 0.0)

    def forward(
        self, window: Tensor, x: Tensor, g: Tensor, memory: Tensor, beams: int = 1, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``window`` (N, d, T + k - 1): the layer's (dropped-out) inputs x^{l-1}, after the k - 1
        earlier ones (zeros before y_0). ``x`` (N, T, d) the same inputs without dropout
        (the residual); ``g`` (N, T, d) the embeddings; ``memory`` (N / beams, 2, L, d): z and z + e;
        ``bias`` (N / beams, L) added to the scores (a focus prior). -> x^l (N, T, d), a^l (N, T, L)."""
        h = F.glu(self.conv(window), dim=1).transpose(1, 2)  # (N, T, d): GLU(A; B) = A * sigmoid(B)
        d = self.W_d(h) + g  # d^l_i = W_d h^l_i + b_d + g_i
        N, T, width = d.shape
        z, values = memory[:, 0], memory[:, 1]  # (B, L, d) each
        scores = torch.bmm(d.reshape(N // beams, beams * T, width), z.transpose(1, 2))  # (B, beams T, L): d . z_j
        if bias is not None:  # one prior per image, for each of its rows and positions
            scores = scores + bias.unsqueeze(1)
        a = torch.softmax(scores, -1)  # a^l_ij
        c = torch.bmm(a, values).reshape(N, T, width)  # c^l_i = sum_j a^l_ij (z_j + e_j)
        return (h + c + x) * math.sqrt(0.5), a.reshape(N, T, -1)


@dataclass
class ConvState:
    """A batch of N rows (images, or images x beams) during decoding."""

    position: Tensor  # (N,) long: the position of the word the next step reads
    cache: Tensor  # (N, layers, k - 1, d): each layer's (dropped-out) inputs at the k - 1 positions before it
    memory: Tensor  # (N / beams, 2, L, d): the grid's keys z and values z + e, every layer's
    beams: int = 1
    #: (N / beams, L) added to every layer's scores before the softmax, per image: a prior over the
    #: locations (decoding/steering.py's focus, as DecoderState.bias); None: none
    bias: Tensor | None = None

    def select(self, index: Tensor) -> ConvState:
        """Rows ``index`` (a slice, or (N',) indices); one row per image only."""
        if self.beams != 1:
            raise ValueError("select() needs one row per image; beams share their image's memory")
        bias = None if self.bias is None else self.bias[index]
        return ConvState(self.position[index], self.cache[index], self.memory[index], bias=bias)

    def expand_beams(self, beams: int) -> ConvState:
        """Each image's rows copied to ``beams`` rows; the memory (and prior) stay one copy per image."""
        if self.beams != 1:
            raise ValueError("expand_beams() of a state that already has beams")
        position, cache = self.position.repeat_interleave(beams, 0), self.cache.repeat_interleave(beams, 0)
        return ConvState(position, cache, self.memory, beams, self.bias)


class ConvStates:
    """How the search loops (decoding/search.py) take a :class:`ConvState` apart: carried (position,
    cache), reordered with the beams row by row; constant per image (memory)."""

    n_carried, n_constants = 2, 1

    @staticmethod
    def carried(state: ConvState) -> list[Tensor]:
        return [state.position, state.cache]

    @staticmethod
    def constants(state: ConvState) -> list[Tensor]:
        return [state.memory]

    @staticmethod
    def state(carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> ConvState:
        return ConvState(*carried, *constants, beams)

    @staticmethod
    def reorder(carried: list[Tensor], rows: Tensor) -> list[Tensor]:
        return [x[rows] for x in carried]


class ConvDecoder(nn.Module):
    """Gated causal convolutions over the words, each layer attending to the grid (module docstring).
    Built as ``cls(vocab_size, feature_dim, config)``."""

    #: the loops' view of the state (decoding/search.py)
    state_layout = ConvStates
    #: a focus prior (ConvState.bias, decoding/steering.py) reaches every layer's scores
    takes_attention_bias = True

    def __init__(self, vocab_size: int, feature_dim: int, config: ConvConfig | None = None):
        super().__init__()
        config = config if config is not None else ConvConfig()
        self.config = config
        d, p = config.hidden_dim, config.dropout
        self.vocab_size, self.hidden_dim, self.kernel_size = vocab_size, d, config.kernel_size
        self.attention_kind = "soft"
        self.num_layers, self.max_positions = config.layers, config.max_positions
        #: the layer whose maps decoding returns (the first by default; "mean": the mean over the layers)
        self.attention_layer = 0 if config.attention_layer is None else config.attention_layer
        #: the token ids after which EOS may be forbidden: set by ShowAttendTell (as the LSTM's)
        self.bad_ending_ids: tuple[int, ...] | None = None
        self.embedding = nn.Embedding(vocab_size, d, padding_idx=Vocabulary.pad_id)  # E
        self.position_embedding = nn.Embedding(config.max_positions, d)  # P
        for table in (self.embedding, self.position_embedding):  # ConvS2S: N(0, 0.1)
            nn.init.normal_(table.weight, std=0.1)
        with torch.no_grad():
            self.embedding.weight[Vocabulary.pad_id].zero_()
        self.W_z = nn.Linear(feature_dim, d)
        self.W_e = nn.Linear(feature_dim, d)
        self.layers = nn.ModuleList(ConvLayer(d, config.kernel_size, p) for _ in range(config.layers))
        self.W_o = nn.Linear(d, vocab_size)
        for layer, drop in ((self.W_z, 0.0), (self.W_e, 0.0), (self.W_o, p)):
            init_linear(layer, 1.0, drop)
        self.dropout = nn.Dropout(p)

    # ------------------------------------------------------------------ building blocks
    def memory(self, features: Tensor) -> Tensor:
        """The grid's keys z and values z + e, once per image: (B, L, D) -> (B, 2, L, d)."""
        gh, gw = grid_shape(features.size(1))
        z = self.W_z(features)
        e = self.W_e(features) + grid_position_embedding(gh, gw, self.hidden_dim, features.device, features.dtype)
        return torch.stack([z, z + e], 1)

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """g = Dropout(E y + P_i): tokens and positions (...,) -> (..., d)."""
        return self.dropout(self.embedding(tokens) + self.position_embedding(positions))

    def check_length(self, T: int) -> None:
        """A one-line ConfigError if the learned positions cannot reach T tokens (from shapes: nothing
        read from the device, so that a captured step stays capturable)."""
        if T > self.max_positions:
            raise ConfigError(
                f"model.decoder.max_positions: this model's learned positions end at {self.max_positions}; "
                f"{T} tokens are more (lower max_new_tokens or max_length)"
            )

    def logits(self, x: Tensor) -> Tensor:
        return self.W_o(self.dropout(x))

    def initial_state(self, features: Tensor, max_steps: int | None = None) -> ConvState:
        """The grid's memory once, empty caches (the causal padding's zeros) at position 0; ``max_steps``
        is checked against the learned positions. features: (B, L, D)."""
        if max_steps is not None:
            self.check_length(max_steps)
        memory = self.memory(features)
        B = features.size(0)
        cache = memory.new_zeros(B, self.num_layers, self.kernel_size - 1, self.hidden_dim)
        return ConvState(torch.zeros(B, dtype=torch.long, device=features.device), cache, memory)

    # ------------------------------------------------------------------ teacher forcing
    def run(self, features: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Every position at once: tokens (B, T) -> logits (B, T, V) and every layer's attention
        weights (B, layers, T, L)."""
        T = tokens.size(1)
        self.check_length(T)
        memory = self.memory(features)
        g = self.embed(tokens, torch.arange(T, device=tokens.device))
        x, maps = g, []
        for layer in self.layers:
            window = F.pad(self.dropout(x).transpose(1, 2), (self.kernel_size - 1, 0))  # (B, d, k - 1 + T): causal
            x, a = layer(window, x, g, memory)
            maps.append(a)
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
        mask = teacher_forcing_mask("conv", captions, lengths, mode, use_expected, locations, sample_prob)
        logits, maps = self.run(features, captions[:, :-1])
        alphas = self.chosen_maps(maps.unbind(1)) * mask.unsqueeze(-1)  # (B, T, L)
        return DecoderOutput(
            logits=logits if static else logits[mask],
            mask=mask,
            alphas=alphas,
            betas=mask.to(alphas.dtype),
            locations=alphas.argmax(-1) * mask,
        )

    def chosen_maps(self, maps: Sequence[Tensor]) -> Tensor:
        """Of each layer's maps, ``attention_layer``'s, or their mean over the layers."""
        if self.attention_layer == "mean":
            return sum(maps[1:], maps[0]) / len(maps)
        return maps[self.attention_layer]

    # ------------------------------------------------------------------ generation
    def step(
        self, tokens: Tensor, state: ConvState, mode: str | None = None, attention_temperature: float = 1.0
    ) -> tuple[Tensor, ConvState, Glimpse]:
        """One decoding step: previous tokens (N,) -> log p (N, V), the state with each layer's input
        shifted into its cache, the glimpse (``alpha`` (N, L): ``attention_layer``'s map, or the
        mean; ``views["layers"]`` (N, layers, L): every layer's). ``mode`` and
        ``attention_temperature`` are hard attention's (ignored)."""
        g = self.embed(tokens, state.position).unsqueeze(1)  # (N, 1, d)
        x, caches, maps = g, [], []
        for i, layer in enumerate(self.layers):
            window = torch.cat([state.cache[:, i], self.dropout(x)], 1)  # (N, k, d): the k inputs it reads
            x, a = layer(window.transpose(1, 2), x, g, state.memory, state.beams, state.bias)
            caches.append(window[:, 1:])
            maps.append(a[:, 0])  # (N, L)
        logits = self.logits(x[:, 0])
        log_probs = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        alpha = self.chosen_maps(maps)
        new_state = ConvState(state.position + 1, torch.stack(caches, 1), state.memory, state.beams, state.bias)
        return log_probs, new_state, Glimpse(None, alpha, alpha.argmax(-1), views={"layers": torch.stack(maps, 1)})
