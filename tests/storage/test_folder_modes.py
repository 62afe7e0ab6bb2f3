"""A model folder's files are written with the umask's mode, the weights like the rest (a private temporary
file's 0600 used to stay on model.safetensors)."""

import os
import stat

from captioning.api import Captioner
from tests.helpers import FIXTURES


def test_every_file_of_a_model_folder_has_the_umasks_mode(tmp_path):
    old = os.umask(0o022)
    try:
        Captioner.from_pretrained(FIXTURES / "v0_1_8e72f85" / "hard_folder").save_pretrained(tmp_path / "folder")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "folder").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
