"""`captioning score`: a results file scored by evaluate's own path; its bad input in one line.

The module's commands run without Java (PATH without ``java``: the Python PTB tokenizer, no METEOR), so
that each takes well under a second; ``test_score_equals_evaluate_with_java`` (slow) repeats the
comparison with Java's tokenizer and METEOR."""

import json
import os
import shutil

import pytest

from captioning.cli import main
from tests.helpers import make_aichallenger, path_without_java

PATH_WITH_JAVA = os.environ.get("PATH", "")


@pytest.fixture(scope="module")
def no_java():
    """PATH without java for the module's tests (the scorers then use the Python tokenizer, no METEOR)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", path_without_java(PATH_WITH_JAVA))
        yield


def evaluate_files(checkpoint, annotations, out, split="val") -> dict:
    """evaluate's metrics file, results file and per-image file of ``checkpoint`` on ``split``."""
    paths = {k: out / f"{k}.json" for k in ("metrics", "results")}
    paths["per_image"] = out / "per_image.jsonl"
    code = main(
        ["evaluate", "--checkpoint", str(checkpoint), "--annotations", str(annotations), "--split", split]
        + ["--max-new-tokens", "6", "--device", "cpu", "--out", str(paths["metrics"])]
        + ["--results", str(paths["results"]), "--per-image", str(paths["per_image"])]
    )
    assert code == 0
    return paths


@pytest.fixture(scope="module")
def evaluated(no_java, tiny_checkpoint, tiny_shapes, tmp_path_factory):
    """evaluate's metrics file, results file and per-image file of the tiny checkpoint on the val split."""
    return evaluate_files(tiny_checkpoint, tiny_shapes, tmp_path_factory.mktemp("evaluated"))


def assert_score_gives_evaluates_numbers(evaluated, annotations, tmp_path, capfd, names=("object_f1", "CHAIR_i")):
    out, per_image = tmp_path / "metrics.json", tmp_path / "per_image.jsonl"
    code = main(
        ["score", str(evaluated["results"]), "--annotations", str(annotations), "--split", "val"]
        + ["--out", str(out), "--per-image", str(per_image)]
    )
    assert code == 0, capfd.readouterr().err
    evaluate_scores = json.loads(evaluated["metrics"].read_text())["scores"]
    report = json.loads(out.read_text())
    assert report["num_images"] == report["split_images"] == 8
    scores = report["scores"]
    # every score of the captions themselves (not the decoder's attention, which a results file lacks)
    for name in ("BLEU-1", "BLEU-4", "ROUGE_L", "CIDEr", "distinct_1", *names):
        assert scores[name] == evaluate_scores[name], name
    shared = {k for k in scores if not k.startswith("attention")} & set(evaluate_scores)
    assert {k: scores[k] for k in shared} == {k: evaluate_scores[k] for k in shared}
    assert per_image.read_text() == evaluated["per_image"].read_text()
    rows = [json.loads(line) for line in per_image.read_text().splitlines()]
    assert len(rows) == 8 and {"image_id", "caption", "references", "BLEU-4", "CIDEr"} <= rows[0].keys()
    mean_cider = sum(r["CIDEr"] for r in rows) / len(rows)
    assert mean_cider == pytest.approx(scores["CIDEr"])
    return scores, rows


def test_score_of_evaluates_captions_gives_evaluates_numbers(evaluated, tiny_shapes, tmp_path, capfd):
    scores, rows = assert_score_gives_evaluates_numbers(evaluated, tiny_shapes, tmp_path, capfd)
    assert {"object_f1", "CHAIR_s"} <= rows[0].keys() and "CHAIR_s" in scores


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None, reason="needs Java (PTB tokenizer, METEOR)")
def test_score_equals_evaluate_with_java(tiny_checkpoint, tiny_shapes, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("PATH", PATH_WITH_JAVA)
    evaluated = evaluate_files(tiny_checkpoint, tiny_shapes, tmp_path)
    scores, rows = assert_score_gives_evaluates_numbers(evaluated, tiny_shapes, tmp_path, capfd, ("METEOR",))
    assert "METEOR" in rows[0] and "METEOR" in scores


@pytest.fixture(scope="module")
def aichallenger(no_java, tiny_checkpoint, tiny_shapes, tmp_path_factory):
    """The tiny shapes val split in AI Challenger's layout (images named "<40 hex>.jpg"), and evaluate's
    files of the tiny checkpoint on it."""
    root = tmp_path_factory.mktemp("aichallenger")
    annotations, names = make_aichallenger(tiny_shapes, root, "val")
    return annotations, names, evaluate_files(tiny_checkpoint, annotations, root)


def test_results_name_ai_challenger_images_by_their_file_names(aichallenger, tmp_path, capfd):
    annotations, names, evaluated = aichallenger
    results = json.loads(evaluated["results"].read_text())
    assert sorted(r["image_id"] for r in results) == sorted(names.values())  # "<40 hex>.jpg", not positions
    scores, rows = assert_score_gives_evaluates_numbers(evaluated, annotations, tmp_path, capfd, ())
    assert sorted(r["image_id"] for r in rows) == sorted(names.values())
    # AI Challenger's own evaluation names an image without ".jpg": the same captions, the same scores
    bare = write(tmp_path / "bare.json", [dict(r, image_id=r["image_id"][: -len(".jpg")]) for r in results])
    out = tmp_path / "bare_metrics.json"
    assert main(["score", bare, "--annotations", str(annotations), "--split", "val", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["scores"] == scores


def test_ai_challenger_results_by_position_or_named_twice_are_one_line(aichallenger, tmp_path, capfd):
    annotations, _, evaluated = aichallenger
    results = json.loads(evaluated["results"].read_text())
    by_position = write(tmp_path / "r.json", [dict(r, image_id=k) for k, r in enumerate(results)])
    out = tmp_path / "m.json"
    assert main(["score", by_position, "--annotations", str(annotations), "--split", "val", "--out", str(out)]) == 1
    err = capfd.readouterr().err
    assert "ids of another dataset or split?" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    twice = write(tmp_path / "t.json", results + [dict(results[0], image_id=results[0]["image_id"][:-4])])
    assert main(["score", twice, "--annotations", str(annotations), "--split", "val", "--out", str(out)]) == 1
    err = capfd.readouterr().err
    assert f"image {results[0]['image_id']!r} has more than one caption" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


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
        ("bad_id", "image_id must be an integer (or the dataset's own name of the image), got [1]"),
        ("other_dataset", "ids of another dataset or split?"),
        ("not_list", "expected a COCO results list"),
    ],
)
def test_bad_results_file_is_one_line_and_nothing_is_written(evaluated, tiny_shapes, tmp_path, capfd, items, message):
    good = json.loads(evaluated["results"].read_text())
    items = {
        "duplicate": good + [good[0]],
        "not_string": [*good[:-1], {"image_id": good[-1]["image_id"], "caption": 7}],
        "bad_id": [*good[:-1], {"image_id": [1], "caption": "a dog"}],
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
