"""Diverse beams labelled by group (API and `captioning caption`), an ensemble's members' attention maps
(API, render, `captioning attend`), and the decoding study's table (tools/decoding_study.py)."""
import json

import numpy as np
import pytest

from captioning.cli import main


@pytest.fixture(scope="module")
def images(tiny_shapes) -> list:
    root = tiny_shapes.parent / "images"
    return [str(p) for p in sorted((root / "test").glob("*.png"))][:4]


# ---------------------------------------------------------------------- diverse beams by group
def test_api_labels_each_beam_with_its_group(tiny_checkpoint, images):
    from captioning.api import Captioner

    captioner = Captioner.from_checkpoint(tiny_checkpoint, "cpu")
    results = captioner(images, num_beams=4, num_beam_groups=2, diversity_penalty=2.0, num_return_sequences=4)
    for r in results:
        assert sorted(b["group"] for b in r["beams"]) == [1, 1, 2, 2]
        assert r["beams"][0]["generated_text"] == r["generated_text"]
    plain = captioner(images, num_beams=4, num_return_sequences=4)
    assert all("group" not in b for r in plain for b in r["beams"])


def test_caption_prints_every_group(tiny_checkpoint, images, capsys):
    args = ["caption", images[0], "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--num-beams", "4",
            "--num-beam-groups", "2", "--diversity-penalty", "2.0"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(images[0] + "\t")
    assert [line.split("\t")[0] for line in lines[1:]] == ["  group 1", "  group 1", "  group 2", "  group 2"]
    assert main(args + ["--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert [b["group"] for b in row["beams"]] == [1, 1, 2, 2]
    assert row["generated_text"] in [b["generated_text"] for b in row["beams"]]
    assert main(args[:-4] + ["--json"]) == 0  # without groups: no beams listed, as before
    assert "beams" not in json.loads(capsys.readouterr().out)[0]
