"""Checkpoint ensembles: several captioners of one vocabulary decoding together.

Each member encodes the images at its own image size and keeps its own recurrent and attention
state; at each step the members' log-probabilities are averaged, weighted (weights normalised to
sum 1; equal by default), and the search (greedy, beam, sampling, every GenerationConfig option)
chooses words from the average: log p(y_t) = sum_m w_m log p_m(y_t). A caption's score is so the
weighted mean of its members' scores. Members may mix soft and hard attention: each decodes in its
own kind, the config's ``attention_mode`` / ``attention_temperature`` / ``location_samples`` apply to
the hard members.

The search loops (search.py) see an :class:`EnsembleDecoder` as a decoder (how: its docstring). A
focus (decoding/steering.py) steers every member with the same box's prior on its own grid
(:meth:`EnsembleDecoder.focused`).

    ensemble = Ensemble([model_a, model_b], weights=[0.7, 0.3], names=["a.ckpt", "b.ckpt"])
    out = ensemble.generate(images=batch, config=GenerationConfig(num_beams=3))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.common import grid_shape
from captioning.decoding.generation import GenerationConfig
from captioning.decoding.search import GenerationOutput, generate, state_layout
from captioning.errors import ConfigError
from captioning.fast import fast_decoder
from captioning.models.decoder import Glimpse


def ensemble_weights(weights: Sequence[float] | None, members: int) -> tuple[float, ...]:
    """The members' weights normalised to sum 1 (equal when None); one-line ConfigError otherwise."""
    if weights is None:
        return (1.0 / members,) * members
    weights = [float(w) for w in weights]
    if len(weights) != members:
        raise ConfigError(f"ensemble weights: {len(weights)} weights for {members} models")
    if any(not w >= 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"ensemble weights: expected non-negative numbers with a positive sum, got {weights}")
    total = sum(weights)
    return tuple(w / total for w in weights)


@dataclass
class EnsembleState:
    """The members' states (an LSTM's :class:`DecoderState`, a transformer's) of N rows (images, or images x beams)."""

    members: tuple

    @property
    def beams(self) -> int:
        return self.members[0].beams

    def select(self, index: Tensor) -> EnsembleState:
        """Rows ``index`` of every member's state (one row per image only)."""
        return EnsembleState(tuple(m.select(index) for m in self.members))

    def expand_beams(self, beams: int) -> EnsembleState:
        """Each image's state copied to ``beams`` rows, in every member."""
        return EnsembleState(tuple(m.expand_beams(beams) for m in self.members))


class EnsembleDecoder:
    """The members' decoders as one decoder for the search loops: the averaged log-probabilities.

    ``initial_state`` over the members' features (one tensor per member) gives an :class:`EnsembleState`.
    Its carried tensors are the members' one after the other: an LSTM's h, c; a transformer's position
    and key/value cache (members of both kinds mix). ``step`` gives the averaged log-probabilities,
    the new state and a glimpse. The glimpse's ``alpha`` is the members' weighted mean map, on the
    first member's grid (the others' maps are resampled to it). Its ``head_alpha`` holds each member's
    map on that grid (N, members, L): the search returns them as ``head_alphas``, the API as
    "member_attention". Its ``location`` is the mean map's argmax.

    ``state_layout`` is itself: how search.py takes an :class:`EnsembleState` apart (each member's
    carried tensors and constants, member after member, by the member's own layout) and puts it
    back together."""

    def __init__(self, decoders: Sequence[nn.Module], weights: Sequence[float]):
        self.decoders, self.weights = list(decoders), tuple(weights)
        first = self.decoders[0]
        self.vocab_size = first.vocab_size
        self.bad_ending_ids = getattr(first, "bad_ending_ids", None)
        self.layouts = [state_layout(d) for d in self.decoders]
        self.n_carried = sum(layout.n_carried for layout in self.layouts)
        self.n_constants = sum(layout.n_constants for layout in self.layouts)
        # "hard" where any member is: the search's hard-attention options (best_of_k) then apply to those members
        self.attention_kind = "hard" if any(d.attention_kind == "hard" for d in self.decoders) else "soft"
        self.state_layout = self

    def initial_state(self, features: Sequence[Tensor], max_steps: int | None = None) -> EnsembleState:
        """features: one (B, L_m, D_m) tensor per member."""
        if len(features) != len(self.decoders):
            raise ValueError(
                f"an ensemble of {len(self.decoders)} models needs as many feature tensors, got {len(features)}"
            )
        return EnsembleState(tuple(d.initial_state(f, max_steps) for d, f in zip(self.decoders, features)))

    def focused(self, biases: Sequence[Tensor]) -> EnsembleDecoder:
        """The same ensemble with each member steered by its own focus prior (B, L_m) on its grid
        (decoding/steering.py: the same box, one prior per member grid)."""
        from captioning.decoding.steering import Focused

        if len(biases) != len(self.decoders):
            raise ValueError(f"an ensemble of {len(self.decoders)} models needs as many priors, got {len(biases)}")
        return EnsembleDecoder([Focused(d, b) for d, b in zip(self.decoders, biases)], self.weights)

    # search.py's state layout
    def carried(self, state: EnsembleState) -> list[Tensor]:
        """The members' carried tensors, member after member."""
        return [t for layout, m in zip(self.layouts, state.members) for t in layout.carried(m)]

    def constants(self, state: EnsembleState) -> list[Tensor]:
        """The members' per-image tensors, member after member."""
        return [t for layout, m in zip(self.layouts, state.members) for t in layout.constants(m)]

    def state(self, carried: list[Tensor], constants: list[Tensor], beams: int = 1) -> EnsembleState:
        members, i, j = [], 0, 0
        for layout in self.layouts:
            members.append(
                layout.state(carried[i : i + layout.n_carried], constants[j : j + layout.n_constants], beams)
            )
            i, j = i + layout.n_carried, j + layout.n_constants
        return EnsembleState(tuple(members))

    def reorder(self, carried: list[Tensor], rows: Tensor) -> list[Tensor]:
        out, i = [], 0
        for layout in self.layouts:
            out += layout.reorder(carried[i : i + layout.n_carried], rows)
            i += layout.n_carried
        return out

    def step(
        self, tokens: Tensor, state: EnsembleState, mode: str | None = None, attention_temperature: float = 1.0
    ) -> tuple[Tensor, EnsembleState, Glimpse]:
        """One step of every member: previous tokens (N,) -> the weighted mean of the members' log p
        (N, V), the new state, the glimpse of the members' weighted mean map (with each member's
        map, (N, members, L), as its ``head_alpha``)."""
        outs = [d.step(tokens, s, mode, attention_temperature) for d, s in zip(self.decoders, state.members)]
        new_state = EnsembleState(tuple(o[1] for o in outs))
        if len(outs) == 1:
            return outs[0][0], new_state, outs[0][2]
        log_probs = sum(w * o[0] for w, o in zip(self.weights, outs))
        maps = on_first_grid([o[2].alpha for o in outs])
        alpha = weighted_sum(maps, self.weights)
        return log_probs, new_state, Glimpse(None, alpha, alpha.argmax(-1), head_alpha=torch.stack(maps, 1))


def on_first_grid(alphas: Sequence[Tensor]) -> list[Tensor]:
    """Attention maps (N, L_m) on the first map's grid: the others resampled to it (bilinear) and
    renormalised to sum 1. -> one (N, L_0) map per input."""
    L = alphas[0].size(-1)
    gh, gw = grid_shape(L)
    out = []
    for a in alphas:
        if a.size(-1) != L:
            h, wd = grid_shape(a.size(-1))
            a = (
                F.interpolate(a.reshape(-1, 1, h, wd).float(), size=(gh, gw), mode="bilinear", align_corners=False)
                .reshape(-1, L)
                .to(alphas[0].dtype)
            )
            a = a / a.sum(-1, keepdim=True).clamp(min=1e-12)
        out.append(a)
    return out


def weighted_sum(maps: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    total = 0
    for w, a in zip(weights, maps):
        total = total + w * a
    return total


def mean_map(alphas: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """The weighted mean of attention maps (N, L_m), on the first map's grid (:func:`on_first_grid`). -> (N, L_0)."""
    return weighted_sum(on_first_grid(alphas), weights)


class Ensemble(nn.Module):
    """Captioners (ShowAttendTell) of one vocabulary, decoding together; used where one model is
    (``generate``, ``features``, ``vocab``, ``spec``, ``attention_kind``, ``decode_text``).

    ``names``: the members' files, for messages. ``spec``: the first member's, with the largest
    member image size (what readers of a split load images at; :meth:`features` resizes them
    for the members of other sizes)."""

    def __init__(
        self, models: Sequence[nn.Module], weights: Sequence[float] | None = None, names: Sequence[str] | None = None
    ):
        super().__init__()
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        names = list(names) if names is not None else [f"model {k + 1}" for k in range(len(models))]
        first = models[0]
        for model, name in zip(models[1:], names[1:]):
            if list(model.vocab.itos) != list(first.vocab.itos):
                raise ConfigError(
                    f"ensemble: {names[0]} and {name} have different vocabularies "
                    f"({len(first.vocab)} and {len(model.vocab)} words); an ensemble needs one vocabulary"
                )
        self.members = nn.ModuleList(models)
        self.names = names
        self.weights = ensemble_weights(weights, len(models))
        self.vocab = first.vocab
        self.image_sizes = tuple(int(m.spec.image_size) for m in models)
        self.spec = dataclasses.replace(first.spec, image_size=max(self.image_sizes))
        kinds = {m.attention_kind for m in models}
        self.attention_kind = kinds.pop() if len(kinds) == 1 else "mixed"
        self.decoder = EnsembleDecoder([fast_decoder(m.decoder) for m in models], self.weights)  # their fast twins

    def features(self, batch: dict) -> list[Tensor]:
        """Each member's annotation vectors of a batch's ``images`` (B, 3, S, S), resized to the
        member's image size where S differs; ``image_index`` as ShowAttendTell.features."""
        if "features" in batch:
            if len(self.members) > 1:
                raise ConfigError("an ensemble encodes images: cached features belong to one model's encoder")
            return [self.members[0].features(batch)]
        return [
            m.features({**batch, "images": resize(batch["images"], size)})
            for m, size in zip(self.members, self.image_sizes)
        ]

    def encode(self, images: Tensor | Sequence[Tensor]) -> list[Tensor]:
        """Each member's features (B, L_m, D_m) of images: one batch (B, 3, S, S), resized per
        member where needed, or one batch per member at its own size."""
        if isinstance(images, Tensor):
            images = [resize(images, size) for size in self.image_sizes]
        return [m.encoder(x) for m, x in zip(self.members, images)]

    @torch.no_grad()
    def generate(
        self,
        images: Tensor | Sequence[Tensor] | None = None,
        features: Sequence[Tensor] | None = None,
        config: GenerationConfig = GenerationConfig(),
        generator: torch.Generator | None = None,
    ) -> GenerationOutput:
        """Captions of images (see :meth:`encode`) or of the members' features (one tensor per member)."""
        if features is None:
            features = self.encode(images)
        return generate(self.decoder, list(features), config, generator)

    def decode_text(self, sequences: Tensor) -> list[str]:
        return [self.vocab.decode_text(row) for row in sequences.tolist()]


def short_names(paths: Sequence[str]) -> list[str]:
    """Members' files as people tell them apart: the parts of their paths that differ (the run folders
    of runs/a/.../last.ckpt and runs/b/.../last.ckpt: "a", "b"), else the file names."""
    parts = [os.path.normpath(str(p)).split(os.sep) for p in paths]
    if len(parts) > 1 and len({len(p) for p in parts}) == 1:
        differ = [k for k in range(len(parts[0])) if len({p[k] for p in parts}) > 1]
        if differ:
            return [os.sep.join(p[differ[0] : differ[-1] + 1]) for p in parts]
    return [p[-1] for p in parts]


def resize(images: Tensor, size: int) -> Tensor:
    """images (B, 3, S, S) at size x size (antialiased bilinear; unchanged when S == size)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
