"""A request's decoding settings, derived from :class:`~captioning.decoding.generation.GenerationConfig`.

Every GenerationConfig field whose option is marked ``web`` (:func:`form_options`) is a field of
the page's form and of ``POST /api/caption``: its text is parsed and checked by the option itself
(:meth:`~captioning.decoding.generation.GenerationOption.parse`: type, bounds, choices, a one-line
error naming the field), within the server's caps (:data:`CAPS`) on the fields that multiply a
request's work. The fields are then checked together by GenerationConfig over the model's own
settings (``ServedModel.settings``). A field left out, or empty, is the model's own value. A new
decoding option (a logits processor's, a plugin's too) therefore reaches the form and the API
without an edit here.

Besides them, the steering fields ``focus`` ("x0,y0,x1,y1", a box in the uploaded image's own
pixels) and ``focus_strength`` (default 10) (:class:`Focus`, :func:`parse_focus`): checked as the
commands check ``--focus`` and ``--focus-strength`` (decoding/steering.py), the box against the
image once the worker has read its size.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from captioning.decoding.generation import GenerationOption, generation_options, when_options_change
from captioning.decoding.steering import DEFAULT_STRENGTH, Box, check_shape, check_strength, parse_box
from captioning.errors import ConfigError
from captioning.web.errors import RequestError

#: The server's bounds on fields, (low, high) inclusive, narrowing the options' own: beams, tokens
#: and location samples multiply a request's work; the penalties are kept to ranges a user means.
CAPS: dict[str, tuple[float, float]] = {
    "num_beams": (1, 10),
    "max_new_tokens": (1, 100),
    "location_samples": (1, 10),
    "length_penalty": (-5.0, 5.0),
    "diversity_penalty": (0.0, 10.0),
}
MAX_BEAMS = int(CAPS["num_beams"][1])
MAX_TOKENS = int(CAPS["max_new_tokens"][1])  # the cap of max_new_tokens, asked for or the model's own
PAGE_BEAMS = 3  # beams when the request names none (the page's beam search; the API's own default is one beam)
DIVERSITY_PENALTY = 0.5  # diverse beam search's penalty when the request asks for groups without one


@functools.cache
def form_options() -> dict[str, GenerationOption]:
    """The form's decoding fields, by name: every GenerationConfig option marked ``web``, with the
    bounds of :data:`CAPS` where the server narrows them."""
    options = {}
    for option in generation_options():
        if not option.web:
            continue
        if option.name in CAPS:
            low, high = CAPS[option.name]
            option = dataclasses.replace(
                option,
                min=max(low, option.min) if option.min is not None else low,
                max=min(high, option.max) if option.max is not None else high,
            )
        options[option.name] = option
    return options


when_options_change(form_options.cache_clear)  # a plugin's processor registered: its options are fields too


#: the steering fields, as ``GET /api/models`` lists them after the decoding options
FOCUS_OPTIONS = (
    {
        "name": "focus",
        "type": "box",
        "default": None,
        "help": "describe this region: x0,y0,x1,y1 in the uploaded image's own pixels (a prior on the attention)",
        "min": None,
        "max": None,
        "min_inclusive": True,
        "max_inclusive": True,
        "choices": None,
    },
    {
        "name": "focus_strength",
        "type": "float",
        "default": DEFAULT_STRENGTH,
        "help": "how much attention score the cells outside the focus box lose (0: no focus)",
        "min": 0.0,
        "max": None,
        "min_inclusive": True,
        "max_inclusive": True,
        "choices": None,
    },
)
FOCUS_FIELDS = tuple(o["name"] for o in FOCUS_OPTIONS)


@dataclass(frozen=True)
class Focus:
    """A request's focus: the box in the uploaded image's own pixels and the prior's strength."""

    box: Box
    strength: float

    def as_dict(self) -> dict:
        """The answer's ``focus``."""
        return {"box": list(self.box), "strength": self.strength}


def parse_focus(fields: Mapping[str, str]) -> Focus | None:
    """The request's :class:`Focus` (None without a ``focus`` field); a :class:`RequestError` (400)
    in one line for a box that is not four finite numbers, inverted or of zero area, and for a
    strength that is not a finite number >= 0 (checked even without a box). Whether the box lies
    inside the image is checked once the image is read (its size)."""
    box_text = str(fields.get("focus") or "").strip()
    strength_text = str(fields.get("focus_strength") or "").strip()
    try:
        strength = DEFAULT_STRENGTH
        if strength_text:
            try:
                strength = float(strength_text)
            except ValueError:
                shown = repr(strength_text) if len(strength_text) <= 40 else repr(strength_text[:37] + "...")
                raise ConfigError(f"focus_strength: expected a finite number >= 0, got {shown}") from None
            strength = check_strength(strength, "focus_strength")
        if not box_text:
            return None
        return Focus(check_shape(parse_box(box_text, "focus"), "focus"), strength)
    except ConfigError as err:
        raise RequestError(str(err)) from None


def form_description() -> list[dict]:
    """The form's fields for ``GET /api/models``' ``options`` (the page draws an input for each
    it lacks): the decoding options, with name, type (int, float, bool, str, tokens), default
    (GenerationConfig's; a model has its own), help, bounds and choices; then the steering fields
    :data:`FOCUS_OPTIONS` (``focus`` of type ``box``)."""
    kinds = {int: "int", float: "float", bool: "bool", str: "str", tuple: "tokens"}
    return [
        {
            "name": o.name,
            "type": kinds[o.type],
            "default": list(o.default) if o.type is tuple else o.default,
            "help": o.help,
            "min": o.min,
            "max": o.max,
            "min_inclusive": o.min_inclusive,
            "max_inclusive": o.max_inclusive,
            "choices": list(o.choices) if o.choices else None,
        }
        for o in form_options().values()
    ] + [dict(o) for o in FOCUS_OPTIONS]


def truthy(value) -> bool:
    """A form's flag (``return_gif``, ``return_image``): 1, true, yes or on."""
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


class Settings:
    """A request's decoding settings: every form field, None where the model's own value holds.

    The fields are attributes (``settings.num_beams``); settings are hashable and equal when their
    fields are, so that the queue batches the requests that share them. ``num_beams`` is
    :data:`PAGE_BEAMS` and ``num_beam_groups`` 1 unless the request sets them.
    """

    __slots__ = ("_values",)

    def __init__(self, **values: Any):
        options = form_options()
        unknown = set(values) - set(options)
        if unknown:
            raise TypeError(f"not decoding fields of the web form: {', '.join(sorted(unknown))}")
        defaults = {"num_beams": PAGE_BEAMS, "num_beam_groups": 1}
        self._values = tuple((name, values.get(name, defaults.get(name))) for name in options)

    def __getattr__(self, name: str) -> Any:  # only called for names that are not attributes: the fields
        for field, value in object.__getattribute__(self, "_values"):
            if field == name:
                return value
        raise AttributeError(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self._values == other._values

    def __hash__(self) -> int:
        return hash(self._values)

    def __repr__(self) -> str:
        given = ", ".join(f"{name}={value!r}" for name, value in self._values if value is not None)
        return f"Settings({given})"

    def as_dict(self) -> dict:
        """Every field, None where the model's own value holds (the answer's ``settings``)."""
        return dict(self._values)

    @classmethod
    def parse(cls, fields: Mapping[str, str], hard: bool) -> Settings:
        """Settings from form fields (strings); a :class:`RequestError` names the first bad field.

        Each field is checked alone here, by its option (in field order; ``num_beam_groups`` and
        ``num_return_sequences`` at most ``num_beams``); ``ServedModel.settings`` checks them together. ``attention_mode`` only means something to a
        hard-attention model and is dropped for a soft one. Diverse beam search without a
        ``diversity_penalty`` gets :data:`DIVERSITY_PENALTY`.
        """
        options = form_options()
        values: dict[str, Any] = {}
        for name, option in options.items():
            text = str(fields.get(name) or "").strip()
            if name in ("num_beam_groups", "num_return_sequences"):  # bounded by the beams asked for
                option = dataclasses.replace(option, max=values.get("num_beams", PAGE_BEAMS))
            if text:
                try:
                    values[name] = option.parse(text)
                except ConfigError as err:
                    raise RequestError(str(err)) from None
        if not hard:
            values.pop("attention_mode", None)
        if values.get("num_beam_groups", 1) > 1 and values.get("diversity_penalty") is None:
            values["diversity_penalty"] = DIVERSITY_PENALTY
        return cls(**values)
