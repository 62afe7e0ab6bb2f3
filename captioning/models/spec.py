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
from dataclasses import dataclass, field
from typing import Any

from captioning.checked import from_dict
from captioning.compat import UNRECORDED_INTERPOLATION
from captioning.data.images import DEFAULT_INTERPOLATION, check_interpolation
from captioning.decoding.generation import GenerationConfig, recorded
from captioning.errors import ConfigError
from captioning.files import plain_json
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.kinds import decoder_config

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
        decoder: the decoder's config, of the kind its ``kind`` names (models/kinds.py; the paper's
            LSTM, :class:`~captioning.models.decoder.DecoderConfig`, by default).
        image_size: the side S images are resized to, (B, 3, S, S).
        generation: the model's default decoding (``captioning test``'s, and the API's beams and
            caption length unless a call says otherwise).
        interpolation: the filter images are resized with (data/images.py: INTERPOLATIONS); None
            (the default): the one the encoder's weights expect (:func:`encoder_interpolation`),
            fixed when the spec is made. A description read from a file that records none is bilinear.
    """

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: Any = field(default_factory=DecoderConfig)
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
        "interpolation": "bicubic"}; a plugin's decoding option only where it is not at its default."""
        return plain_json({**dataclasses.asdict(self), "generation": recorded(self.generation)})

    @classmethod
    def from_dict(cls, data: Any, where: str = "model") -> ModelSpec:
        """The spec of :meth:`to_dict`'s dictionary, every field checked (``where``: the prefix of the
        errors' field names). Missing fields take their defaults, as settings a newer version added;
        a missing interpolation is the resize of every model written before it was recorded
        (captioning/compat.py)."""
        if isinstance(data, dict) and "interpolation" not in data:
            data = {**data, "interpolation": UNRECORDED_INTERPOLATION}
        if isinstance(data, dict):  # the decoder's config is of the kind it names
            data = {**data, "decoder": decoder_config(data.get("decoder"), f"{where}.decoder")}
        return from_dict(cls, data, where)

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


__all__ = ["ModelSpec", "build_model", "encoder_interpolation", "NOT_ARCHITECTURE"]
