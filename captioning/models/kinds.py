"""Decoder kinds (``model.decoder.kind``): the registry of their configs and the dispatch on ``kind``.

A kind is a config dataclass registered here under its name, with a ``kind`` field and a
``build(vocab_size, feature_dim)`` that makes its ``nn.Module``: "lstm" (models/decoder.py, the
paper's), "transformer" (models/transformer.py). A decoder module gives ``forward`` (teacher
forcing -> DecoderOutput), ``initial_state``, ``step``, ``vocab_size``, ``attention_kind`` and
``bad_ending_ids``; a state other than the LSTM's (h, c) is described to the search loops by a
``state_layout`` (decoding/search.py). A config dictionary names its kind; none named is "lstm".
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from captioning.registry import Registry

#: decoder kinds: name -> config dataclass (with ``kind`` and ``build``)
DECODERS: Registry[type] = Registry("decoder kind", field="model.decoder.kind")

#: the modules of the built-in kinds and variants, imported on first use (each registers itself)
BUILT_IN = (
    "captioning.models.decoder",
    "captioning.models.attention",
    "captioning.models.transformer",
    "captioning.models.conv",
)


def load_built_ins() -> None:
    for module in BUILT_IN:
        importlib.import_module(module)


def list_decoders() -> list[str]:
    """The registered kinds' names (``model.decoder.kind``'s choices)."""
    load_built_ins()
    return DECODERS.names()


def decoder_config(data: Any = None, where: str = "model.decoder"):
    """The config of the kind ``data`` names: a config (returned as it is), a dictionary of its
    fields (each checked: one-line ConfigErrors naming ``where``), or None (the paper's decoder)."""
    from captioning.checked import from_dict
    from captioning.compat import decoder_fields
    from captioning.errors import ConfigError

    load_built_ins()
    if data is None:
        data = {}
    if any(isinstance(data, config) for config in map(DECODERS.get, DECODERS)):
        return data
    if not isinstance(data, dict):
        shown = repr(data) if len(repr(data)) <= 60 else repr(data)[:57] + "..."
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__} {shown}")
    data = decoder_fields(data)
    kind = data.get("kind", "lstm")
    if not isinstance(kind, str) or kind not in DECODERS:
        raise DECODERS.unknown(kind, f"{where}.kind")
    config = DECODERS.get(kind)
    for key in data:  # a setting of another kind: say whose
        owners = [k for k in DECODERS if k != kind and key in fields(DECODERS.get(k))]
        if key not in fields(config) and owners:
            raise ConfigError(
                f"{where}.{key}: an option of decoder kind {owners[0]!r}; this decoder is kind {kind!r} "
                f"(set kind: {owners[0]}, or remove {key})"
            )
    return from_dict(config, data, where)


def fields(config: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config)}


def build_decoder(vocab_size: int, feature_dim: int, config):
    """The decoder module of ``config``'s kind."""
    return config.build(vocab_size, feature_dim)
