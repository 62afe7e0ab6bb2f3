"""The docs quote the program: the pixel limits, the web API's examples (settings, training data,
model names) and the decoding options' table, checked against the constants and code they quote."""

import json
import re

import pytest

from captioning.cli.main import build_parser
from tests.helpers import ROOT

WEB = (ROOT / "docs" / "WEB.md").read_text()
EVALUATION = (ROOT / "docs" / "EVALUATION.md").read_text()


def help_text(command: str) -> str:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return " ".join(sub.format_help().split())


def test_caption_help_quotes_pillows_pixel_limit():
    from PIL import Image

    from captioning.cli.options import PILLOW_PIXELS

    assert PILLOW_PIXELS == Image.MAX_IMAGE_PIXELS
    assert f"default: Pillow's, {Image.MAX_IMAGE_PIXELS:,})" in help_text("caption")


def test_web_md_quotes_the_servers_pixel_limit():
    from captioning.web.server import DEFAULT_MAX_PIXELS

    [table] = re.findall(r"^\| `--max-pixels` \| `(\d+)` \|", WEB, flags=re.M)
    assert int(table) == DEFAULT_MAX_PIXELS
    quoted = re.findall(r"(\d+) (?:megapixels|MP)\b", WEB)
    assert quoted and all(int(q) * 1_000_000 == DEFAULT_MAX_PIXELS for q in quoted), quoted


def test_web_md_settings_example_is_the_servers():
    """The answer's `settings` example lists the fields of Settings().as_dict(), in its order, with its
    values (the request sets num_beams 3, as the example's curl does)."""
    from captioning.web.settings import Settings

    [example] = re.findall(r'"settings": \{(.*?)\}', WEB, flags=re.S)
    shown = re.findall(r'"(\w+)": (\w+|[\d.]+)', example)
    expected = Settings(num_beams=3).as_dict()
    assert [k for k, _ in shown] == [k for k in expected if k in dict(shown)]
    assert {k: json.loads(v) for k, v in shown} == {k: expected[k] for k, _ in shown}
    assert {"num_beam_groups", "diversity_penalty"} <= dict(shown).keys()


def test_web_md_training_data_is_a_file_name():
    from captioning.web.served import _file_names

    [shown] = re.findall(r'"training_data": "([^"]+)"', WEB)
    assert shown == _file_names("outputs/demo/data/dataset_shapes.json")


def test_web_md_names_two_unnamed_soft_models_as_the_server_does():
    from types import SimpleNamespace

    from captioning.web.server import _name_models

    models = [SimpleNamespace(name="", description={"attention": "soft", "encoder": "small_cnn"}) for _ in range(2)]
    _name_models(models, [None, None])
    names = [m.name for m in models]
    assert names == ["soft-small_cnn", "soft-small_cnn-2"]
    assert all(f"`{n}`" in WEB for n in names)


@pytest.mark.parametrize("command", ["caption", "attend", "evaluate"])
def test_evaluation_md_lists_flags_the_commands_have(command):
    """Every flag of EVALUATION.md's decoding-options table is a flag of the decoding commands."""
    table = EVALUATION.split("## Decoding options", 1)[1].split("\n\n", 3)[2]
    flags = re.findall(r"^\| `(--[\w-]+)", table, flags=re.M)
    assert len(flags) > 10
    missing = [f for f in flags if f"{f} " not in help_text(command) and not help_text(command).endswith(f)]
    assert not missing, missing
