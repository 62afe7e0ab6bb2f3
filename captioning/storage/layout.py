"""The model folder: the files a shared model is made of, read with checks and without PyTorch.

A model folder (written by ``captioning export``) holds

    config.json         the architecture (encoder and decoder settings, attention kind), the
                        encoder's preprocessing (image size, resize interpolation, normalisation,
                        grid), the generation
                        defaults and a format version; see :func:`read_config`
    vocab.json          the vocabulary ({"itos": [...], "min_freq": n})
    model.safetensors   the weights only (a safetensors file: a JSON header and raw tensors, no code)
    README.md           the model card
    encoder.onnx, decoder_step*.onnx   instead of the weights, in a folder of ``--format onnx``

This module names the files, and reads config.json and vocab.json with checks; it imports neither
torch nor onnxruntime, so that both the PyTorch loader (storage/folder.py, storage/load.py) and the
ONNX captioner (export/onnx_captioner.py) use it. Hub ids: storage/hub.py. Every problem is a one-line
:class:`~captioning.errors.CheckpointError` naming the file.
"""

from __future__ import annotations

import os

from captioning.errors import CheckpointError
from captioning.files import read_json_file

#: the name and version of the folder layout in config.json (a reader refuses newer versions)
FORMAT = "show-attend-tell-captioning"
FORMAT_VERSION = 1

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"
ENCODER_ONNX = "encoder.onnx"
#: the decoder time step of each attention mode (soft models have "expected" only)
STEP_ONNX = {"expected": "decoder_step.onnx", "argmax": "decoder_step_argmax.onnx"}

#: what a folder must hold, by kind
REQUIRED = {"safetensors": (CONFIG_FILE, VOCAB_FILE, WEIGHTS_FILE), "onnx": (CONFIG_FILE, VOCAB_FILE, ENCODER_ONNX)}


def read_json(path: str) -> object:
    """A JSON file's value; one line naming the file when it is missing, malformed or not a regular
    file (files.py: read_json_file, every JSON reader's: any bytes, any depth, any number of digits)."""
    return read_json_file(path, CheckpointError, "a JSON file")


def _need(config: dict, path: str, *keys: str):
    value = config
    for i, key in enumerate(keys):
        if not isinstance(value, dict) or key not in value:
            raise CheckpointError(
                f"{path}: no {'.'.join(keys[: i + 1])!r} (not a config.json written by `captioning export`)"
            )
        value = value[key]
    return value


#: the fields both readers (storage/folder.py, export/onnx_captioner.py) use, and the type each must have
FIELDS = {
    ("model", "encoder"): dict,
    ("model", "decoder"): dict,
    ("model", "vocab_size"): "count",
    ("model", "num_locations"): "count",
    ("model", "feature_dim"): "count",
    ("preprocessing", "image_size"): "count",
    ("generation",): dict,
}
#: the largest count (a size of the model) config.json may give: what a 32-bit shape holds
MAX_COUNT = 2**31 - 1
#: fields a folder may leave out (or set to null), checked when present
OPTIONAL_FIELDS = {("preprocessing", "interpolation"): str, ("card",): dict, ("training",): dict}


def _check_type(value, expected, path: str, where: str) -> None:
    """A one-line CheckpointError naming the file and the field unless ``value`` is of the ``expected``
    type (``"count"``: an integer from 1 to :data:`MAX_COUNT`, not a boolean)."""
    if expected == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: {where} must be a positive integer, got {value!r:.40}")
        if value > MAX_COUNT:
            raise CheckpointError(
                f"{path}: {where} must be at most {MAX_COUNT:,}, got an integer of {len(str(value))} digits"
            )
    elif not isinstance(value, expected):
        kind = {dict: "an object", str: "a string"}[expected]
        raise CheckpointError(f"{path}: {where} must be {kind}, got {type(value).__name__} {value!r:.40}")


def _check_graph_names(onnx: dict, path: str) -> None:
    """The ONNX graphs config.json names are plain ``*.onnx`` file names in the folder itself (an
    absolute path or a ``..`` would make a shared folder read files from elsewhere)."""
    steps = onnx.get("steps", {})
    if not isinstance(steps, dict):
        raise CheckpointError(f"{path}: onnx.steps must be an object {{mode: file name}}")
    for where, name in [("onnx.encoder", onnx.get("encoder", ENCODER_ONNX))] + [
        (f"onnx.steps.{k}", v) for k, v in steps.items()
    ]:
        if not (
            isinstance(name, str)
            and name.endswith(".onnx")
            and not name.startswith(".")
            and "/" not in name
            and "\\" not in name
        ):
            raise CheckpointError(
                f"{path}: {where} must be the name of a .onnx file in the folder itself, got {name!r}"
            )


def read_config(folder: str, kind: str = "safetensors") -> dict:
    """config.json of a model folder, checked: its format, version and the fields loading needs.

    ``kind``: "safetensors" or "onnx", the files the folder must hold besides it.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise CheckpointError(
            f"{folder}: no such model folder"
            if not os.path.exists(folder)
            else f"{folder}: a file, not a model folder (a folder written by `captioning export`)"
        )
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file (a model folder holds {', '.join(REQUIRED[kind])})")
    config = read_json(path)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f'{path}: not a captioning model config (expected "format": "{FORMAT}")')
    version = config.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format_version {version!r}; this version of captioning reads up to "
            f"{FORMAT_VERSION} (upgrade captioning)"
        )
    for keys, expected in FIELDS.items():
        _check_type(_need(config, path, *keys), expected, path, ".".join(keys))
    for keys, expected in OPTIONAL_FIELDS.items():
        parent = config.get(keys[0]) if len(keys) == 2 else config
        if isinstance(parent, dict) and parent.get(keys[-1]) is not None:
            _check_type(parent[keys[-1]], expected, path, ".".join(keys))
    if kind == "onnx" and not isinstance(config.get("onnx"), dict):
        raise CheckpointError(
            f"{path}: no 'onnx' section: this folder holds PyTorch weights, not ONNX graphs "
            "(load it with Captioner.from_pretrained / --checkpoint, or export it with --format onnx)"
        )
    if kind == "onnx":
        _check_graph_names(config["onnx"], path)
    for name in REQUIRED[kind][1:]:
        file = os.path.join(folder, name)
        if not os.path.isfile(file):
            hint = ""
            if name == WEIGHTS_FILE and isinstance(config.get("onnx"), dict):
                hint = " (an ONNX folder: caption with `captioning caption --onnx FOLDER`, or OnnxCaptioner)"
            raise CheckpointError(f"{file}: no such file{hint}")
    return config


def read_vocab_itos(folder: str, vocab_size: int) -> dict:
    """vocab.json of a model folder as {"itos", "min_freq"}, checked against config.json's vocab_size."""
    path = os.path.join(os.fspath(folder), VOCAB_FILE)
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("itos"), list):
        raise CheckpointError(f'{path}: not a vocabulary (expected {{"itos": [...]}})')
    if len(data["itos"]) != vocab_size:
        raise CheckpointError(
            f"{path}: {len(data['itos'])} tokens, but config.json's model has a vocabulary of "
            f"{vocab_size} (the vocabulary of another model?)"
        )
    return data


def read_vocab(folder: str, vocab_size: int):
    """The :class:`~captioning.vocab.Vocabulary` of a model folder (see :func:`read_vocab_itos`)."""
    from captioning.errors import ConfigError
    from captioning.vocab import Vocabulary

    data = read_vocab_itos(folder, vocab_size)
    try:
        return Vocabulary.from_dict(data)
    except ConfigError as err:
        raise CheckpointError(
            f"{os.path.join(os.fspath(folder), VOCAB_FILE)}: {str(err).removeprefix('vocabulary: ')}"
        ) from None
