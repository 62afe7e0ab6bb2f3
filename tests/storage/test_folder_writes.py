"""Model folders are written whole: `export` stopped after the weights but before config.json (a
real process, killed) leaves the old folder or none, never new weights under an old config that
loads; a link in the folder is replaced, never written through; an --out that is a link is refused."""

import os
import subprocess
import sys

import pytest
import torch

from captioning.cli import main
from captioning.errors import CaptioningError, CheckpointError
from captioning.storage.folder import save_folder
from captioning.storage.load import load_model

#: a child that runs `captioning export` and kills itself (SIGKILL) as config.json is about to be written
KILLED_EXPORT = """
import os, signal, sys
from captioning.cli import main
from captioning.storage import folder
write = folder.atomic_write_json
def killing(path, obj, *args, **kwargs):
    if os.path.basename(path) == "config.json":  # the weights and vocabulary are written by now
        os.kill(os.getpid(), signal.SIGKILL)
    return write(path, obj, *args, **kwargs)
folder.atomic_write_json = killing
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def two_models(tiny_checkpoint, tmp_path_factory):
    """(folder A, folder B): the tiny model and the same architecture with other weights."""
    root = tmp_path_factory.mktemp("two_models")
    a, b = root / "a", root / "b"
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(a)]) == 0
    model = load_model(a)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    save_folder(b, model)
    return a, b


def weights(folder) -> dict:
    return {k: v.clone() for k, v in load_model(folder).state_dict().items()}


def same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def killed_export(source, out, *flags) -> None:
    argv = ["export", "--checkpoint", str(source), "--out", str(out), *flags]
    done = subprocess.run([sys.executable, "-c", KILLED_EXPORT, *argv], capture_output=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]


def test_an_overwrite_killed_before_config_json_never_loads_new_weights_under_the_old_config(two_models, tmp_path):
    a, b = two_models
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", str(a), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")  # a file of the user's in the folder
    old = weights(out)
    killed_export(b, out, "--overwrite")
    try:
        now = weights(out)
    except CheckpointError as err:  # the folder is refused as a whole, in one line
        assert "config.json" in str(err) and "\n" not in str(err)
    else:
        assert same(now, old)  # (or still all old)
    assert (out / "notes.txt").read_text() == "mine"
    assert main(["export", "--checkpoint", str(b), "--out", str(out), "--overwrite"]) == 0
    assert same(weights(out), weights(b)) and (out / "notes.txt").read_text() == "mine"


def test_a_new_export_killed_leaves_no_folder(two_models, tmp_path):
    a, _ = two_models
    out = tmp_path / "new"
    killed_export(a, out)
    assert not out.exists()
    assert main(["export", "--checkpoint", str(a), "--out", str(out)]) == 0
    assert same(weights(out), weights(a))


def test_links_in_the_folder_are_replaced_and_a_linked_out_is_refused(two_models, tmp_path, capsys):
    a, b = two_models
    victim = tmp_path / "precious.bin"
    victim.write_bytes(b"keep me")
    out = tmp_path / "model"
    out.mkdir()
    (out / "model.safetensors").symlink_to(victim)
    (out / "README.md").symlink_to(victim)
    assert main(["export", "--checkpoint", str(b), "--out", str(out), "--overwrite"]) == 0
    assert victim.read_bytes() == b"keep me" and not (out / "model.safetensors").is_symlink()
    assert same(weights(out), weights(b))
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(CaptioningError, match="a symbolic link") as err:
        save_folder(linked, load_model(a))
    assert "\n" not in str(err.value) and not os.path.exists(tmp_path / "elsewhere")
