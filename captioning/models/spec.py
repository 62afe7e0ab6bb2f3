"""The model description: one plain dataclass from which a captioner is built, in training and at inference.

    spec = ModelSpec(EncoderConfig("small_cnn"), DecoderConfig(attention_kind="hard"), image_size=64)
    model = build_model(spec, vocab)            # a ShowAttendTell; model.spec is spec
    ModelSpec.from_dict(spec.to_dict()) == spec

A checkpoint written by ``fit`` and a model folder written by ``captioning export`` are two files of
this description (storage/checkpoint.py, storage/folder.py): the encoder and decoder settings, the
image size, the resize's interpolation and the default decoding. The image preprocessing follows
from them: images are resized to ``image_size`` x ``image_size`` with ``interpolation`` (the filter
the encoder's weights were trained with: bicubic for most timm and OpenCLIP ViTs, bilinear
otherwise) and scaled to [0, 1]; the encoder normalises them with the mean and standard deviation of
its weights (models/encoders.py). Files written before the interpolation was recorded were read
with a bilinear resize, and still are.

:meth:`ModelSpec.from_dict` checks every field of a description read from a file: a wrong type, an
unknown setting or a value out of range is a one-line :class:`~captioning.errors.ConfigError`
naming the field. The fields are those of the dataclasses themselves: a new decoder option is one
field of :class:`~captioning.models.decoder.DecoderConfig`, read and written here without more code.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from captioning.compat import UNRECORDED_INTERPOLATION
from captioning.data.images import DEFAULT_INTERPOLATION, check_interpolation
from captioning.decoding.generation import GenerationConfig
from captioning.errors import ConfigError
from captioning.files import plain_json
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.transformer import TransformerDecoder  # noqa: F401 (registers decoder kind "transformer")

#: settings that change how a model trains or runs, not what its weights mean (see ModelSpec.architecture)
NOT_ARCHITECTURE = {
    "encoder": ("pretrained", "weights", "fine_tune_blocks", "channels_last"),
    "decoder": ("dropout", "compile_step"),
}


@dataclass
class ModelSpec:
    """What a Show, Attend and Tell captioner is, without its weights and vocabulary.

    Args:
        encoder: the image encoder (backbone, grid).
        decoder: the attention LSTM decoder (sizes, attention kind and variant).
        image_size: the side S images are resized to, (B, 3, S, S).
        generation: the model's default decoding (``captioning test``'s, and the API's beams and
            caption length unless a call says otherwise).
        interpolation: the filter images are resized with (data/images.py: INTERPOLATIONS); None
            (the default): the one the encoder's weights expect (:func:`encoder_interpolation`),
            fixed when the spec is made. A description read from a file that records none is bilinear.
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    image_size: int = 224
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(num_beams=3))
    interpolation: str | None = None

    def __post_init__(self):
        if isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or self.image_size < 1:
            raise ConfigError(f"image_size: expected an integer >= 1, got {self.image_size!r}")
        if self.interpolation is None:
            self.interpolation = encoder_interpolation(self.encoder)
        check_interpolation(self.interpolation)

    def to_dict(self) -> dict:
        """Plain JSON values: {"encoder": {...}, "decoder": {...}, "image_size": S, "generation": {...},
        "interpolation": "bicubic"}."""
        return plain_json(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Any, where: str = "model") -> ModelSpec:
        """The spec of :meth:`to_dict`'s dictionary, every field checked (``where``: the prefix of the
        errors' field names). Missing fields take their defaults, as settings a newer version added;
        a missing interpolation is the resize of every model written before it was recorded
        (captioning/compat.py)."""
        if isinstance(data, dict) and "interpolation" not in data:
            data = {**data, "interpolation": UNRECORDED_INTERPOLATION}
        return _from_dict(cls, data, where)

    def without_pretrained(self) -> ModelSpec:
        """This spec with an encoder that downloads nothing (the weights come from a model file)."""
        return dataclasses.replace(self, encoder=dataclasses.replace(self.encoder, pretrained=False, weights=None))

    def architecture(self) -> dict:
        """What the weights' meaning depends on: the settings of :meth:`to_dict` except those of
        :data:`NOT_ARCHITECTURE` and the decoding. Two models whose architectures are equal can
        swap weights."""
        plain = self.to_dict()
        return {
            "image_size": plain["image_size"],
            **{
                part: {k: v for k, v in plain[part].items() if k not in NOT_ARCHITECTURE[part]}
                for part in ("encoder", "decoder")
            },
        }

    def architecture_differences(self, other: ModelSpec) -> list[str]:
        """``"decoder.hidden_dim is 512 here, 256 there"`` for each architecture setting that differs."""
        mine, theirs = self.architecture(), other.architecture()
        out = [f"image_size is {mine['image_size']!r} here, {theirs['image_size']!r} there"] * (
            mine["image_size"] != theirs["image_size"]
        )
        return out + [
            f"{part}.{k} is {v!r} here, {theirs[part].get(k)!r} there"
            for part in ("encoder", "decoder")
            for k, v in mine[part].items()
            if theirs[part].get(k) != v
        ]


def build_model(spec: ModelSpec, vocab):
    """The :class:`~captioning.models.show_attend_tell.ShowAttendTell` of ``spec`` writing in ``vocab``
    (fresh weights; a pretrained encoder's if ``spec.encoder`` asks for them). ``model.spec`` is ``spec``."""
    from captioning.models.show_attend_tell import ShowAttendTell

    return ShowAttendTell(spec.encoder, spec.decoder, vocab, spec=spec)


def encoder_interpolation(encoder: EncoderConfig) -> str:
    """The resize ``encoder``'s weights expect, from its library's configuration, without building it
    (the value the built encoder records in ``Encoder.preprocessing``, from the same configuration):
    a timm model's pretrained configuration, an OpenCLIP tower's preprocessing (bicubic unless it
    says otherwise); bilinear for the other backbones."""
    name = encoder.name
    if name.startswith("timm:"):
        from captioning.models.encoders import timm_pretrained_cfg  # (a Hub backbone's: from its config.json)

        return timm_pretrained_cfg(name[len("timm:") :]).get("interpolation") or DEFAULT_INTERPOLATION
    if name.startswith("open_clip:"):
        from captioning.models.encoders import open_clip_preprocess_cfg  # (a Hub tower's: its config's)

        return open_clip_preprocess_cfg(name[len("open_clip:") :]).get("interpolation") or "bicubic"
    return DEFAULT_INTERPOLATION


# ---------------------------------------------------------------------- checked reading
def _kind(hint) -> str:
    """A type hint in words, for errors."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _kind(a) for a in args)
    if origin is tuple:
        return f"a list of {_kind(args[0])}s"
    if dataclasses.is_dataclass(hint):
        return "a mapping of settings"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def _checked(value: Any, hint, where: str) -> Any:
    """``value`` if it has the type ``hint`` (converted: int -> float, list -> tuple, dict -> dataclass),
    else a one-line ConfigError naming ``where``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _from_dict(hint, value, where)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _checked(value, option, where)
            except ConfigError:
                pass
    elif origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(_checked(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        return value
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise ConfigError(f"{where}: expected {_kind(hint)}, got {shown}")


def _from_dict(cls, data: Any, where: str):
    """An instance of the dataclass ``cls`` from a dictionary of its fields, each checked."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__} {_short(data)}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(k) if str(k).isidentifier() else repr(str(k)) for k in data if k not in names)  # one line
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)} (this version knows {', '.join(names)})")
    hints = typing.get_type_hints(cls)
    values = {name: _checked(data[name], hints[name], f"{where}.{name}") for name in names if name in data}
    try:
        return cls(**values)
    except ConfigError as err:  # the dataclass's own range checks name "model.decoder.x" or "x"
        message = str(err)
        raise ConfigError(
            message if message.startswith(where) or message.startswith("model.") else f"{where}.{message}"
        ) from None


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


__all__ = ["ModelSpec", "build_model", "encoder_interpolation", "NOT_ARCHITECTURE"]
