"""Steering a caption towards a region: a prior over the attention's locations at decode time.

``focus = (x0, y0, x1, y1)`` in the original image's pixels (exclusive ends, as the shapes data's
boxes) becomes, through the preprocessing (the image is resized to S x S, no crop, so a pixel
maps to the same fraction of the grid), the share ``m_i`` in [0, 1] of each of the L grid cells
that the box covers. The prior ``S (m_i - 1)`` (S = ``focus_strength``) is added to the attention
scores e_ti of every step before the softmax (Eq. 5): cells inside the box keep their scores,
cells outside lose S. For hard attention the same alpha_t is the distribution locations are
sampled from (or the argmax's, or the expected context's), so all three modes follow it. A
transformer decoder adds it to the cross-attention scores of every layer and head
(models/transformer.py: ``TransformerState.bias``), so that no layer reads the grid outside the box.

An ensemble (decoding/ensemble.py) is steered member by member: each member's decoder gets the
prior of the same box on its own grid (members may read different image sizes), so every member
reads the region, and the search averages their steered log-probabilities as usual.

It makes the decoder read the region's annotation vectors, so that the words it writes are the ones
those vectors support. It cannot reach a model without attention scores to add the prior to
(:func:`steer_problem` says which). What else it cannot do: docs/EVALUATION.md, "Steering".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from captioning.errors import ConfigError

if TYPE_CHECKING:
    from torch import Tensor

# torch is imported where a prior is built: the box and strength checks serve the web server's
# settings and the CLI's flags, which the ONNX route uses without torch.

Box = tuple[float, float, float, float]

#: the prior's default strength: cells outside the box lose this much of their score
DEFAULT_STRENGTH = 10.0


def parse_box(text: str | Sequence[float], what: str = "--focus") -> Box:
    """``"x0,y0,x1,y1"`` (or four numbers) -> a box of finite floats; one line naming ``what`` if not."""
    items = text.split(",") if isinstance(text, str) else list(text)
    shown = repr(text) if len(repr(text)) <= 60 else repr(text)[:57] + "..."  # one short line
    try:
        box = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected four numbers x0,y0,x1,y1 in the image's pixels, got {shown}") from None
    if len(box) != 4 or not all(math.isfinite(v) for v in box):
        raise ConfigError(f"{what}: expected four finite numbers x0,y0,x1,y1 in the image's pixels, got {shown}")
    return box  # type: ignore[return-value]


def check_strength(strength: float, what: str = "--focus-strength") -> float:
    """A finite number >= 0, else one line naming ``what``."""
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
        raise ConfigError(f"{what}: expected a finite number >= 0, got {strength!r}")
    if strength < 0:
        raise ConfigError(f"{what}: expected a finite number >= 0, got {strength!r}")
    return float(strength)


def check_shape(box: Box, what: str = "--focus") -> Box:
    """The box if x0 < x1 and y0 < y1 (whatever the image); else one line: inverted or zero area."""
    x0, y0, x1, y1 = box
    if x1 < x0 or y1 < y0:
        raise ConfigError(f"{what}: the box {_shown(box)} is inverted (expected x0 < x1 and y0 < y1)")
    if x1 == x0 or y1 == y0:
        raise ConfigError(f"{what}: the box {_shown(box)} has zero area")
    return box


def check_box(box: Box, width: int, height: int, what: str = "--focus", image: str | None = None) -> Box:
    """The box if it is inside the ``width`` x ``height`` image with a positive area; else one line."""
    x0, y0, x1, y1 = check_shape(box, what)
    where = f" of {image}" if image else ""
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
        raise ConfigError(f"{what}: the box {_shown(box)} is outside the {width}x{height} image{where}")
    return box


def _shown(box: Box) -> str:
    return "(" + ", ".join(f"{v:g}" for v in box) + ")"


def cell_coverage(box: Box, width: int, height: int, gh: int, gw: int) -> Tensor:
    """The share of each of the gh x gw grid cells that ``box`` covers: (gh * gw,) float64 in [0, 1].

    The image is resized to a square, so pixel x lies at the fraction x / width of the grid's width."""
    import torch

    x0, y0, x1, y1 = box
    u = torch.tensor([x0 / width, x1 / width], dtype=torch.float64) * gw  # the box in cell units
    v = torch.tensor([y0 / height, y1 / height], dtype=torch.float64) * gh
    cols, rows = torch.arange(gw, dtype=torch.float64), torch.arange(gh, dtype=torch.float64)
    across = (torch.minimum(cols + 1, u[1]) - torch.maximum(cols, u[0])).clamp(min=0)  # (gw,)
    down = (torch.minimum(rows + 1, v[1]) - torch.maximum(rows, v[0])).clamp(min=0)  # (gh,)
    return (down[:, None] * across[None, :]).reshape(-1)


def scale_box(box: Box, size: tuple[int, int], to: tuple[int, int]) -> Box:
    """``box`` in the pixels of an image of ``size`` (W, H) -> the same region of that image
    resized, without a crop, to ``to`` (W', H') (the identity when the sizes are equal)."""
    if tuple(size) == tuple(to):
        return box
    (w, h), (tw, th) = size, to
    x0, y0, x1, y1 = box
    return (x0 * tw / w, y0 * th / h, x1 * tw / w, y1 * th / h)


def focus_prior(box: Box, width: int, height: int, gh: int, gw: int, strength: float) -> Tensor:
    """The prior added to the attention scores: strength * (coverage - 1), (gh * gw,) float64."""
    return strength * (cell_coverage(box, width, height, gh, gw) - 1.0)


def steer_problem(decoder) -> str | None:
    """Why ``decoder`` cannot take a focus prior, in one line; None when it can. An ensemble's
    decoder can when every member's can."""
    members = getattr(decoder, "decoders", None)
    if members is not None:  # an EnsembleDecoder
        return next((p for p in map(steer_problem, members) if p), None)
    if getattr(decoder, "takes_attention_bias", False):  # its state's bias reaches its scores
        return None
    return f"focus: a {type(decoder).__name__} has no attention scores to steer"


class Focused:
    """A decoder whose every step adds ``bias`` (B, L) (one prior per image) to its attention
    scores; everything else is the wrapped decoder's. Built per search, so the prior is an
    argument chosen once, not a setting of the model."""

    def __init__(self, decoder, bias: Tensor):
        problem = steer_problem(decoder)
        if problem:
            raise ConfigError(problem)
        self.decoder, self.bias = decoder, bias

    def __getattr__(self, name):  # vocab_size, attention_kind, bad_ending_ids, ...: the decoder's
        return getattr(self.decoder, name)

    def _with_bias(self, state):
        from captioning.decoding.search import state_layout

        images = state_layout(self.decoder).constants(state)[0]  # a row per image: features, a transformer's memory
        rows = images.size(0)
        bias = self.bias.to(images.dtype)
        if rows != bias.size(0):  # best_of_k repeats each image K times, image-major
            bias = bias.repeat_interleave(rows // bias.size(0), 0)
        return dataclasses.replace(state, bias=bias)

    def initial_state(self, features, *args, **kwargs):
        return self._with_bias(self.decoder.initial_state(features, *args, **kwargs))

    def step(self, tokens, state, *args, **kwargs):
        logp, new_state, g = self.decoder.step(tokens, self._with_bias(state), *args, **kwargs)
        return logp, new_state, g


def focus_boxes(focus, count: int, strength: float | None) -> tuple[list[Box | None] | None, float]:
    """``focus`` as one box (or None) per image, and the strength (None: :data:`DEFAULT_STRENGTH`).

    ``focus``: None, one box ("x0,y0,x1,y1" or four numbers) for every image, or a list of boxes
    (or None) one per image. (None, strength) when there is nothing to steer (no box, strength 0)."""
    strength = check_strength(DEFAULT_STRENGTH if strength is None else strength, "focus_strength")
    if focus is None or strength == 0:
        return None, strength
    single = isinstance(focus, str) or (len(focus) == 4 and all(isinstance(v, (int, float)) for v in focus))
    if single:
        return [parse_box(focus, "focus")] * count, strength
    if len(focus) != count:
        raise ConfigError(f"focus: expected one box or one per image ({count}), got {len(focus)}")
    return [None if b is None else parse_box(b, "focus") for b in focus], strength


def focus_biases(
    boxes: Sequence[Box | None],
    sizes: Sequence[tuple[int, int]],
    L: int | Sequence[int],
    strength: float,
    names=None,
) -> Tensor | list[Tensor] | None:
    """(B, L) float64 priors for images of ``sizes`` (W, H), one box or None (no prior) each; None
    when no image has a box or the strength is 0. ``L`` a sequence (an ensemble's members' grids):
    one such prior per member, on its own grid."""
    import torch

    from captioning.common import grid_shape

    check_strength(strength)
    if strength == 0 or all(b is None for b in boxes):
        return None
    if not isinstance(L, int):
        return [focus_biases(boxes, sizes, locations, strength, names) for locations in L]
    gh, gw = grid_shape(L)
    rows = []
    for i, (box, (w, h)) in enumerate(zip(boxes, sizes)):
        if box is None:
            rows.append(torch.zeros(L, dtype=torch.float64))
            continue
        check_box(box, w, h, "focus", image=None if names is None else names[i])
        rows.append(focus_prior(box, w, h, gh, gw, strength))
    return torch.stack(rows)


def generate_focused(model, images, config, generator, bias: Tensor | Sequence[Tensor] | None):
    """``model.generate`` with the prior ``bias`` (B, L) on every step's attention (None: none).
    An ensemble (``images`` one batch or one per member) takes one prior per member, each on its
    member's grid (:func:`focus_biases` with the members' L)."""
    import torch

    from captioning.decoding.search import generate

    with torch.no_grad():
        if bias is None:
            return model.generate(images=images, config=config, generator=generator)
        if isinstance(bias, torch.Tensor):
            features = model.encoder(images)
            return generate(Focused(model.decoder, bias.to(features.device)), features, config, generator)
        features = model.encode(images)  # an ensemble: one tensor per member
        decoder = model.decoder.focused([b.to(f.device) for b, f in zip(bias, features)])
        return generate(decoder, features, config, generator)
