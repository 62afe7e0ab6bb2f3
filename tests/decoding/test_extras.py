"""Diverse beams labelled by group (API and `captioning caption`), an ensemble's members' attention maps
(API, render, `captioning attend`), and the decoding study's table (tools/studies/decoding_study.py)."""

import json

import numpy as np
import pytest

from captioning.cli import main
from tests.helpers import TINY_PATH, float32_tolerance


@pytest.fixture(scope="module")
def images(tiny_shapes) -> list:
    from tests.helpers import shapes_test_images

    return shapes_test_images(tiny_shapes, 4)


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
    args = [
        "caption",
        images[0],
        "--checkpoint",
        str(tiny_checkpoint),
        "--device",
        "cpu",
        "--num-beams",
        "4",
        "--num-beam-groups",
        "2",
        "--diversity-penalty",
        "2.0",
    ]
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


# ---------------------------------------------------------------------- an ensemble's attention pictures
def test_an_ensemble_returns_and_draws_each_members_map(tiny_checkpoint, images, tmp_path, capsys):
    from PIL import Image

    from captioning.api import Captioner

    single = Captioner.from_checkpoint(tiny_checkpoint, "cpu")
    pair = Captioner.from_checkpoints([tiny_checkpoint, tiny_checkpoint], device="cpu")
    [alone] = single(images[:1], num_beams=3, return_attention=True)
    [both] = pair(images[:1], num_beams=3, return_attention=True)
    assert both["tokens"] == alone["tokens"] and "member_attention" not in alone
    T, gh, gw = alone["attention"].shape
    assert both["member_attention"].shape == (T, 2, gh, gw)
    for k in range(2):  # a model with itself: each member's map is the model's
        np.testing.assert_allclose(
            both["member_attention"][:, k], alone["attention"], **float32_tolerance(1.0, TINY_PATH)
        )
    each, mean = pair.render(images[0], both, members="each"), pair.render(images[0], both)
    plain = single.render(images[0], alone)
    assert len(each) == len(mean) == len(plain)  # a frame per word, then the whole caption
    assert each[0].width > 2 * plain[0].width and mean[0].height > plain[0].height  # side by side; under a title
    with pytest.raises(ValueError, match="members must be"):
        pair.render(images[0], both, members="some")
    out = tmp_path / "pictures"
    assert (
        main(
            [
                "attend",
                images[0],
                "--checkpoint",
                str(tiny_checkpoint),
                "--checkpoint",
                str(tiny_checkpoint),
                "--device",
                "cpu",
                "--members",
                "each",
                "--format",
                "both",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    gif, png = sorted(out.iterdir(), key=lambda p: p.suffix)
    assert Image.open(gif).n_frames == len(each) and Image.open(png).width > 0


# ---------------------------------------------------------------------- tools/studies/decoding_study.py
def test_the_decoding_study_table(tiny_checkpoint, tiny_shapes, tmp_path, capsys):
    from tools.studies import decoding_study

    out = tmp_path / "rows.json"
    args = [
        "--annotations",
        str(tiny_shapes),
        "--checkpoint",
        str(tiny_checkpoint),
        "--checkpoint",
        str(tiny_checkpoint),
        "--rows",
        "beam3",
        "ngram3",
        "ensemble",
        "--limit",
        "6",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--markdown-only",
    ]
    assert decoding_study.main(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| data, attention | decoding |") and len(table) == 2 + 3
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == ["beam3", "ngram3", "ensemble"] and all(r["images"] == 6 for r in rows)
    beam, ensemble = rows[0], rows[2]  # a model with itself: the model's captions
    assert (ensemble["object_f1"], ensemble["CIDEr"], ensemble["distinct_2"]) == (
        beam["object_f1"],
        beam["CIDEr"],
        beam["distinct_2"],
    )
    from captioning.decoding.ensemble import short_names

    assert short_names(["runs/a/last.ckpt", "runs/b/last.ckpt"]) == ["a", "b"] and short_names(["x/a.ckpt"]) == [
        "a.ckpt"
    ]


def test_grounding_scores_each_member_of_an_ensemble(tiny_checkpoint, tiny_shapes):
    from captioning.cli.evaluate import evaluate
    from captioning.decoding.ensemble import Ensemble
    from captioning.storage.load import load_model

    model = load_model(tiny_checkpoint)
    report = evaluate(
        Ensemble([model, model]),
        str(tiny_shapes),
        grounding=True,
        device="cpu",
        progress=False,
        metrics=("CIDEr",),
        tokenizer="python",
    )
    grounding = report["scores"]["grounding"]
    assert len(grounding["per_member"]) == 2 and "per_head" not in grounding
    mean = {k: v for k, v in grounding.items() if k != "per_member"}
    for member in grounding["per_member"]:  # a model with itself: each member's maps are the mean's
        assert member == mean  # (0.5 a + 0.5 a is a, exactly)


def test_attend_members_wrong_value_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        main(
            [
                "attend",
                str(tmp_path / "photo.png"),
                "--checkpoint",
                "a.ckpt",
                "--out",
                str(tmp_path),
                "--members",
                "all",
            ]
        )
    err = capsys.readouterr().err
    assert exit.value.code != 0 and "--members" in err and len(err.strip().splitlines()) == 1, err
