"""The metric registry: a metric is one class registered beside itself; ``evaluate``, ``score``,
``compare``, validation and ``test`` compute every registered metric, a toy one (defined here, nothing
else edited) included, with its per-image column and its interval."""

import json
import os

import numpy as np
import pytest

from captioning.cli import main
from captioning.cli.compare import compare_runs
from captioning.errors import ConfigError
from captioning.evaluation.evaluator import Evaluator
from captioning.metrics import METRICS, Metric, chosen_metrics, list_metrics
from captioning.metrics.bootstrap import per_image_mean
from captioning.training.module import split_evaluators
from tests.helpers import path_without_java


class CaptionWords(Metric):
    """Words per caption: the mean over the images (a toy metric)."""

    def statistics(self, captions):
        return per_image_mean([len(captions.predictions[i].split()) for i in captions.ids])


@pytest.fixture
def toy_metric(monkeypatch):
    """CaptionWords registered as "caption_words" for the test only; no Java (no METEOR's JVM)."""
    monkeypatch.setattr(METRICS, "_entries", dict(METRICS._entries))
    METRICS.register("caption_words")(CaptionWords)
    monkeypatch.setenv("PATH", path_without_java(os.environ.get("PATH", "")))


def words(caption: str) -> int:
    return len(caption.split())


def test_a_registered_metric_is_in_evaluate_score_and_compare(toy_metric, tiny_checkpoint, tiny_shapes, tmp_path):
    out = {k: tmp_path / k for k in ("metrics.json", "results.json", "per_image.jsonl", "scored.json")}
    code = main(
        ["evaluate", "--checkpoint", str(tiny_checkpoint), "--annotations", str(tiny_shapes), "--split", "val"]
        + ["--max-new-tokens", "6", "--device", "cpu", "--out", str(out["metrics.json"])]
        + ["--results", str(out["results.json"]), "--per-image", str(out["per_image.jsonl"])]
    )
    assert code == 0
    captions = {r["image_id"]: r["caption"] for r in json.loads(out["results.json"].read_text())}
    mean = np.mean([words(c) for c in captions.values()])
    assert json.loads(out["metrics.json"].read_text())["scores"]["caption_words"] == pytest.approx(mean)
    rows = [json.loads(line) for line in out["per_image.jsonl"].read_text().splitlines()]
    assert {r["image_id"]: r["caption_words"] for r in rows} == {i: words(c) for i, c in captions.items()}

    code = main(
        ["score", str(out["results.json"]), "--annotations", str(tiny_shapes), "--split", "val"]
        + ["--out", str(out["scored.json"])]
    )
    assert code == 0
    assert json.loads(out["scored.json"].read_text())["scores"]["caption_words"] == pytest.approx(mean)

    # A: half the captions two words longer than B's
    ids = sorted(captions)
    longer = tmp_path / "longer.json"
    longer.write_text(
        json.dumps([{"image_id": i, "caption": captions[i] + " x y" * (k % 2)} for k, i in enumerate(ids)])
    )
    comparison = compare_runs(
        [str(longer)], [str(out["results.json"])], str(tiny_shapes), split="val", resamples=300, progress=lambda _: None
    )
    row = comparison["scores"]["caption_words"]
    assert row["b"] == pytest.approx(mean) and row["difference"] == pytest.approx(2 * (len(ids) // 2) / len(ids))
    assert 0 < row["ci_low"] < row["difference"] < row["ci_high"]
    # swapped at random, the 4 images that differ (by 2 words) give |A - B| >= 1 only all one way: p = 2 / 2^4
    assert row["p_value"] == pytest.approx(1 / 8, abs=0.06)
    assert comparison["runs"]["a"][0][2].scores["caption_words"] == pytest.approx(row["a"])


def test_validation_and_test_compute_every_registered_metric(toy_metric):
    evaluators = split_evaluators()
    assert "caption_words" in evaluators["val"].metrics and "caption_words" in evaluators["test"].metrics
    assert "METEOR" not in evaluators["val"].metrics and "METEOR" in evaluators["test"].metrics
    scores, _ = evaluators["val"].score({1: "a red circle", 2: "a cat"}, {1: ["a red circle"], 2: ["a dog"]})
    assert scores["caption_words"] == pytest.approx(2.5) and "BLEU-4" in scores and "ROUGE_L" not in scores


def test_chosen_metrics_and_their_listing(toy_metric):
    assert chosen_metrics(("CIDEr",)) == (
        "CIDEr",
        "diversity",
        "attention",
        "CLIPScore",
        "objects",
        "grounding",
        "CHAIR",
        "caption_words",
    )
    assert chosen_metrics(spice=True)[:5] == ("BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
    assert "SPICE" not in chosen_metrics() and "SPICE" not in chosen_metrics(spice=True, validation=True)
    assert list_metrics()["caption_words"] == "Words per caption: the mean over the images (a toy metric)."
    with pytest.raises(ConfigError, match="^metrics: unknown metric 'WER'; expected one of BLEU, METEOR"):
        Evaluator(("BLEU", "WER"))


def test_metrics_that_need_java_say_why_they_are_missing(toy_metric):
    """Without Java, METEOR and SPICE are None with the reason in the notes; the other scores are there."""
    evaluator = Evaluator(spice=True)
    scores, notes = evaluator.score({1: "a red circle"}, {1: ["a red circle", "a circle"]})
    assert notes["METEOR"] is None and "needs Java" in notes["METEOR_error"]
    assert notes["SPICE"] is None and "needs Java" in notes["SPICE_error"]
    assert "METEOR" not in scores and "SPICE" not in scores and scores["BLEU-1"] > 0.99
    assert notes["tokens"] == "ptb" and scores["caption_words"] == 3.0
