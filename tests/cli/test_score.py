"""`captioning score`: a results file scored by evaluate's own path; its bad input in one line."""

import json

import pytest

from captioning.cli import main


@pytest.fixture(scope="module")
def evaluated(tiny_checkpoint, tiny_shapes, tmp_path_factory):
    """evaluate's metrics file, results file and per-image file of the tiny checkpoint on the val split."""
    out = tmp_path_factory.mktemp("evaluated")
    paths = {k: out / f"{k}.json" for k in ("metrics", "results")}
    paths["per_image"] = out / "per_image.jsonl"
    code = main(
        ["evaluate", "--checkpoint", str(tiny_checkpoint), "--annotations", str(tiny_shapes), "--split", "val"]
        + ["--max-new-tokens", "6", "--device", "cpu", "--out", str(paths["metrics"])]
        + ["--results", str(paths["results"]), "--per-image", str(paths["per_image"])]
    )
    assert code == 0
    return paths


def test_score_of_evaluates_captions_gives_evaluates_numbers(evaluated, tiny_shapes, tmp_path, capfd):
    out, per_image = tmp_path / "metrics.json", tmp_path / "per_image.jsonl"
    code = main(
        ["score", str(evaluated["results"]), "--annotations", str(tiny_shapes), "--split", "val"]
        + ["--out", str(out), "--per-image", str(per_image)]
    )
    assert code == 0, capfd.readouterr().err
    evaluate_scores = json.loads(evaluated["metrics"].read_text())["scores"]
    report = json.loads(out.read_text())
    assert report["num_images"] == report["split_images"] == 8
    scores = report["scores"]
    # every score of the captions themselves (not the decoder's attention, which a results file lacks)
    for name in ("BLEU-1", "BLEU-4", "ROUGE_L", "CIDEr", "object_f1", "CHAIR_i", "CHAIR_s", "distinct_1"):
        assert scores[name] == evaluate_scores[name], name
    shared = {k for k in scores if not k.startswith("attention")} & set(evaluate_scores)
    assert {k: scores[k] for k in shared} == {k: evaluate_scores[k] for k in shared}
    assert per_image.read_text() == evaluated["per_image"].read_text()
    rows = [json.loads(line) for line in per_image.read_text().splitlines()]
    assert (
        len(rows) == 8
        and {"image_id", "caption", "references", "BLEU-4", "CIDEr", "object_f1", "CHAIR_s"} <= rows[0].keys()
    )
    mean_cider = sum(r["CIDEr"] for r in rows) / len(rows)
    assert mean_cider == pytest.approx(scores["CIDEr"])


def write(path, items):
    path.write_text(json.dumps(items))
    return str(path)


def test_partial_coverage_is_reported_in_one_line_each(evaluated, tiny_shapes, tmp_path, capfd):
    items = json.loads(evaluated["results"].read_text())
    results = write(tmp_path / "r.json", items[:5] + [{"image_id": 99999, "caption": "a small red circle"}])
    out = tmp_path / "m.json"
    code = main(["score", results, "--annotations", str(tiny_shapes), "--split", "val", "--out", str(out)])
    err = capfd.readouterr().err
    assert code == 0
    assert "1 caption(s) for images the 'val' split does not have, not scored: 99999" in err
    assert "3 image(s) of the 'val' split without a caption, not scored" in err
    assert json.loads(out.read_text())["num_images"] == 5


@pytest.mark.parametrize(
    "items, message",
    [
        ("duplicate", "has more than one caption"),
        ("not_string", "the caption must be a string, got 7"),
        ("other_dataset", "ids of another dataset or split?"),
        ("not_list", "expected a COCO results list"),
    ],
)
def test_bad_results_file_is_one_line_and_nothing_is_written(evaluated, tiny_shapes, tmp_path, capfd, items, message):
    good = json.loads(evaluated["results"].read_text())
    items = {
        "duplicate": good + [good[0]],
        "not_string": [*good[:-1], {"image_id": good[-1]["image_id"], "caption": 7}],
        "other_dataset": [{"image_id": 500000 + k, "caption": "a dog"} for k in range(3)],
        "not_list": {"image_id": 1},
    }[items]
    out = tmp_path / "m.json"
    code = main(
        ["score", write(tmp_path / "r.json", items), "--annotations", str(tiny_shapes), "--split", "val"]
        + ["--out", str(out)]
    )
    err = capfd.readouterr().err
    assert code == 1
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
