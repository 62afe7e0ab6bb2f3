"""Every field a model file's readers use, given a value of the wrong type or out of range: one
line naming the file and the field (a CheckpointError), never a traceback. Checkpoints
(storage/checkpoint.py), model folders (storage/folder.py, storage/layout.py) and ONNX folders
(export/onnx_captioner.py)."""

import json
import shutil

import pytest
import torch

from captioning.errors import CheckpointError
from captioning.files import safe_torch_load
from captioning.storage.load import load_model

WRONG = ["x", ["x"], {"a": 1}, 2**70, -1, 1.5, True]

CHECKPOINT_FIELDS = [
    ("preprocessing",),
    ("preprocessing", "interpolation"),
    ("vocabulary",),
    ("vocabulary", "itos"),
    ("state_dict",),
    ("hyper_parameters",),
    ("hyper_parameters", "encoder"),
    ("hyper_parameters", "encoder", "name"),
    ("hyper_parameters", "decoder"),
    ("hyper_parameters", "decoder", "hidden_dim"),
    ("hyper_parameters", "decoder", "attention_kind"),
    ("hyper_parameters", "image_size"),
    ("hyper_parameters", "test_generation"),
    ("hyper_parameters", "test_generation", "num_beams"),
    ("hyper_parameters", "objective"),
    ("hyper_parameters", "optimizer"),
    ("hyper_parameters", "val_generation"),
]
FOLDER_FIELDS = [
    ("model",),
    ("model", "encoder"),
    ("model", "decoder"),
    ("model", "decoder", "hidden_dim"),
    ("model", "vocab_size"),
    ("model", "num_locations"),
    ("model", "feature_dim"),
    ("preprocessing",),
    ("preprocessing", "image_size"),
    ("preprocessing", "interpolation"),
    ("generation",),
    ("generation", "num_beams"),
    ("card",),
    ("training",),
]


def replaced(data: dict, keys: tuple, value) -> dict:
    """A copy of ``data`` whose field at ``keys`` is ``value`` (the containers on the way copied)."""
    out = dict(data)
    if len(keys) == 1:
        out[keys[0]] = value
    else:
        out[keys[0]] = replaced(data[keys[0]], keys[1:], value)
    return out


def assert_one_line(load, path, field: str) -> None:
    with pytest.raises(CheckpointError) as err:
        load(path)
    message = str(err.value)
    assert "\n" not in message and str(path.parent.name) in message, message
    return message


@pytest.fixture(scope="module")
def small_checkpoint(tiny_checkpoint, tmp_path_factory) -> dict:
    """The tiny checkpoint without the optimizer's and the loops' state (what the reader reads)."""
    ckpt = safe_torch_load(tiny_checkpoint)
    return {k: v for k, v in ckpt.items() if k not in ("optimizer_states", "loops", "callbacks", "lr_schedulers")}


@pytest.mark.parametrize("keys", CHECKPOINT_FIELDS, ids=".".join)
def test_a_checkpoint_field_of_a_wrong_type_is_one_line(keys, small_checkpoint, tmp_path):
    for i, value in enumerate(WRONG):
        path = tmp_path / f"case{i}" / "wrong.ckpt"
        path.parent.mkdir()
        torch.save(replaced(small_checkpoint, keys, value), path)
        try:
            load_model(path)
        except CheckpointError as err:
            assert "\n" not in str(err) and str(path) in str(err), (value, str(err))
        # a value that fits (e.g. 1.5 for a float setting, -1 for a count that allows it) may load


@pytest.fixture(scope="module")
def folders(tiny_checkpoint, tmp_path_factory):
    from captioning.cli import main

    root = tmp_path_factory.mktemp("folders")
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(root / "st")]) == 0
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(root / "onnx"), "--format", "onnx"]) == 0
    return root


def load_onnx(folder):
    pytest.importorskip("onnxruntime")
    from captioning.export.onnx_captioner import OnnxCaptioner

    return OnnxCaptioner(folder)


@pytest.mark.parametrize("kind", ["st", "onnx"])
@pytest.mark.parametrize("keys", FOLDER_FIELDS, ids=".".join)
def test_a_model_folder_field_of_a_wrong_type_is_one_line_naming_config_json(kind, keys, folders, tmp_path):
    load = load_onnx if kind == "onnx" else load_model
    config = json.loads((folders / kind / "config.json").read_text())
    for i, value in enumerate(WRONG):
        folder = tmp_path / f"case{i}"
        shutil.copytree(folders / kind, folder)
        (folder / "config.json").write_text(json.dumps(replaced(config, keys, value)))
        try:
            load(folder)
        except CheckpointError as err:
            assert "\n" not in str(err) and str(folder) in str(err), (value, str(err))


@pytest.mark.parametrize("kind", ["st", "onnx"])
@pytest.mark.parametrize(
    "keys, value, words",
    [
        (("model", "vocab_size"), "x", "model.vocab_size must be a positive integer, got 'x'"),
        (("model", "vocab_size"), True, "model.vocab_size must be a positive integer, got True"),
        (("model", "num_locations"), None, "model.num_locations must be a positive integer, got None"),
        (("preprocessing", "image_size"), "224", "preprocessing.image_size must be a positive integer, got '224'"),
        (("preprocessing", "interpolation"), ["x"], "preprocessing.interpolation must be a string, got list ['x']"),
        (("model", "decoder"), ["x"], "model.decoder must be an object, got list ['x']"),
        (("card",), "x", "card must be an object, got str 'x'"),
    ],
)
def test_the_message_names_the_file_and_the_field(kind, keys, value, words, folders, tmp_path):
    load = load_onnx if kind == "onnx" else load_model
    folder = tmp_path / "wrong"
    shutil.copytree(folders / kind, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(replaced(config, keys, value)))
    with pytest.raises(CheckpointError) as err:
        load(folder)
    assert str(err.value) == f"{folder / 'config.json'}: {words}"


def test_a_checkpoint_s_interpolation_of_a_wrong_type_names_the_file_and_the_field(small_checkpoint, tmp_path):
    path = tmp_path / "wrong.ckpt"
    torch.save(replaced(small_checkpoint, ("preprocessing", "interpolation"), ["x"]), path)
    with pytest.raises(CheckpointError) as err:
        load_model(path)
    assert (
        str(err.value) == f"{path}: preprocessing.interpolation must be a string (a PIL filter's name), got list ['x']"
    )
