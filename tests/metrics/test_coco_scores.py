"""coco-caption scoring, object F1 and attention grounding."""

import shutil
import subprocess

import numpy as np
import pytest

from captioning.data.shapes import parse_objects
from captioning.metrics import CocoScorer, grounding_scores, object_f1
from captioning.metrics import coco as metrics

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="pycocoevalcap's tokenizer needs Java")

REFS = {
    1: ["A man is riding a horse on the beach.", "a person rides a brown horse near the sea"],
    2: ["Two dogs play with a red ball in the grass.", "two dogs are playing in a field"],
    3: ["A plate of food with broccoli and rice.", "a white plate holding rice and vegetables"],
}
RIGHT = {i: refs[0] for i, refs in REFS.items()}
WRONG = {1: "a plate of rice", 2: "a man on a beach", 3: "two red dogs"}


@needs_java
def test_identical_captions_score_high_and_beat_wrong_ones():
    scorer = CocoScorer(metrics=("BLEU", "ROUGE_L", "CIDEr"))
    right, wrong = scorer(REFS, RIGHT), scorer(REFS, WRONG)  # the scorer is reused
    assert set(right) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE_L", "CIDEr"}
    assert all(isinstance(v, float) for v in right.values())
    assert right["BLEU-4"] > 0.99 and right["ROUGE_L"] > 0.99
    assert right["CIDEr"] > wrong["CIDEr"] and right["BLEU-4"] > wrong["BLEU-4"]
    assert "METEOR" not in scorer.running()  # made only when asked


@needs_java
def test_scores_equal_pycocoevalcap_called_directly():
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    predictions = {1: "A man riding a horse.", 2: "two dogs playing with a ball", 3: "a plate with rice"}
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": c} for c in refs] for i, refs in REFS.items()})
    res = tok.tokenize({i: [{"caption": c}] for i, c in predictions.items()})
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    expected = {f"BLEU-{n + 1}": b for n, b in enumerate(bleu)}
    expected["ROUGE_L"] = Rouge().compute_score(gts, res)[0]
    expected["CIDEr"] = Cider().compute_score(gts, res)[0]

    got = CocoScorer(metrics=("BLEU", "ROUGE_L", "CIDEr"))(REFS, predictions)
    assert got == pytest.approx(expected, rel=1e-9)
    assert 0 < got["BLEU-4"] < got["BLEU-1"] < 1


@needs_java
@needs_java
def test_the_java_tokenizer_is_quiet_and_gives_pycocoevalcaps_tokens(capfd):
    """Java's "PTBTokenizer tokenized N tokens at ..." line used to reach the terminal."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    captions = {
        i: [{"caption": c} for c in refs] + [{"caption": 'It\'s a dog -- (on) the "grass"...'}]
        for i, refs in REFS.items()
    }
    ours = metrics.java_tokenize(captions)
    capfd.readouterr()
    theirs = PTBTokenizer().tokenize(captions)
    assert "PTBTokenizer tokenized" in capfd.readouterr().err  # pycocoevalcap's own call is chatty
    assert ours == theirs
    CocoScorer(metrics=("BLEU",), tokenizer="java")(REFS, RIGHT)
    assert capfd.readouterr() == ("", "")


def test_predictions_must_cover_exactly_the_reference_ids():
    scorer = CocoScorer(metrics=("BLEU",))
    with pytest.raises(ValueError, match="missing 1 id.*3"):
        scorer(REFS, {1: "a", 2: "b"})
    with pytest.raises(ValueError, match="without references: 9"):
        scorer(REFS, {**RIGHT, 9: "extra"})
    with pytest.raises(ValueError, match="unknown metric"):
        CocoScorer(metrics=("BLEU", "WER"))


@needs_java
def test_empty_and_multiline_captions_keep_ids_aligned():
    predictions = {1: "", 2: "two dogs\nplaying", 3: RIGHT[3]}
    scores = CocoScorer(metrics=("BLEU", "CIDEr"))(REFS, predictions)
    assert all(np.isfinite(v) for v in scores.values())


@needs_java
def test_spice_unavailable_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(metrics, "spice_unavailable_reason", lambda: "SPICE unavailable: needs Stanford CoreNLP")
    scores = CocoScorer(metrics=("BLEU",), spice=True)(REFS, RIGHT)
    assert scores["SPICE"] is None and "CoreNLP" in scores["SPICE_error"]
    assert scores["BLEU-4"] > 0.99

    class Broken:  # SPICE present but failing (e.g. Java out of memory)
        def compute_score(self, gts, res):
            raise subprocess.CalledProcessError(1, ["java", "-jar", "spice-1.0.jar"])

    monkeypatch.setattr(metrics, "spice_unavailable_reason", lambda: None)
    monkeypatch.setattr("pycocoevalcap.spice.spice.Spice", Broken)
    scores = CocoScorer(metrics=("BLEU",), spice=True)(REFS, RIGHT)
    assert scores["SPICE"] is None and "CalledProcessError" in scores["SPICE_error"]


@pytest.mark.slow  # starts METEOR's JVM (about 10 s)
@needs_java
def test_meteor_is_reused_and_closed():
    scorer = CocoScorer()
    right = scorer(REFS, RIGHT)
    process = scorer.running()["METEOR"]._meteor.meteor_p
    wrong = scorer(REFS, WRONG)
    assert scorer.running()["METEOR"]._meteor.meteor_p is process  # one JVM for both calls
    assert set(right) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE_L", "CIDEr"}
    assert 0.9 < right["METEOR"] <= 1.0 and 0 <= wrong["METEOR"] < right["METEOR"]
    scorer.close()
    assert process.poll() is not None and "METEOR" not in scorer.running()


# --------------------------------------------------------------------------- object F1
def test_object_f1_counts_multiset_matches():
    objects = {
        1: [("small", "red", "circle"), ("large", "green", "cross")],
        2: [["large", "blue", "square"]],  # lists (from JSON) are fine
        3: [("small", "red", "circle")],
    }
    predictions = {
        1: "a small red circle and a small red circle",  # one match, one duplicate too many
        2: "a large blue square , a small yellow cross",  # one match, one false
        3: "a red circle",  # partial mentions do not count
        4: "ignored: an image without objects",
    }
    got = object_f1({i: parse_objects(c) for i, c in predictions.items()}, objects)
    assert got["true_positives"] == 2 and got["predicted"] == 4 and got["actual"] == 4
    assert got["precision"] == pytest.approx(0.5) and got["recall"] == pytest.approx(0.5)
    assert got["f1"] == pytest.approx(0.5)

    perfect = object_f1({1: parse_objects("a large green cross and a small red circle")}, {1: objects[1]})
    assert (perfect["precision"], perfect["recall"], perfect["f1"]) == (1.0, 1.0, 1.0)
    silent = object_f1({1: parse_objects("nothing here")}, {1: objects[1]})
    assert (silent["precision"], silent["recall"], silent["f1"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="no prediction.*3"):
        object_f1({1: []}, {1: objects[1], 3: objects[3]})


# --------------------------------------------------------------------------- grounding
def test_grounding_one_hot_quadrant():
    grid = np.zeros((2, 2))
    grid[0, 1] = 1.0  # top-right cell of a 100 x 100 image
    top_right, bottom_left = [50, 0, 100, 50], [0, 50, 50, 100]
    hit = grounding_scores([(grid, (100, 100), top_right)])
    assert hit["count"] == 1 and hit["pointing_game"] == 1.0
    assert 0.7 < hit["attention_correctness"] < 1.0  # bicubic smoothing spills a little
    assert hit["uniform"] == {"attention_correctness": 0.25, "pointing_game": 0.25}
    miss = grounding_scores([(grid, (100, 100), bottom_left)])
    assert miss["pointing_game"] == 0.0 and miss["attention_correctness"] < 0.1
    both = grounding_scores([(grid, (100, 100), top_right), (grid, (100, 100), bottom_left)])
    assert both["pointing_game"] == 0.5
    assert both["attention_correctness"] == pytest.approx(
        (hit["attention_correctness"] + miss["attention_correctness"]) / 2
    )


def test_grounding_baselines_by_hand():
    flat = np.ones((7, 7))
    whole, left_half, wide_left = [0, 0, 100, 60], [0, 0, 50, 60], [0, 0, 51, 60]
    got = grounding_scores([(flat, (100, 60), whole)])
    assert got["attention_correctness"] == pytest.approx(1.0) and got["pointing_game"] == 1.0
    assert got["center_prior"] == {"attention_correctness": pytest.approx(1.0), "pointing_game": 1.0}

    got = grounding_scores([(flat, (100, 60), left_half)])
    assert got["attention_correctness"] == pytest.approx(0.5)  # a uniform attention map
    assert got["uniform"]["attention_correctness"] == pytest.approx(0.5)
    assert got["uniform"]["pointing_game"] == pytest.approx(0.5)
    assert got["center_prior"]["attention_correctness"] == pytest.approx(0.5)  # symmetric
    assert got["center_prior"]["pointing_game"] == 0.0  # the centre x = 50 is the box's (exclusive) end
    assert grounding_scores([(flat, (100, 60), wide_left)])["center_prior"]["pointing_game"] == 1.0

    zero = grounding_scores([(np.zeros((3, 3)), (10, 10), [0, 0, 5, 10])])  # all-zero -> uniform
    assert zero["attention_correctness"] == pytest.approx(0.5)
    empty = grounding_scores([])
    assert empty["count"] == 0 and empty["pointing_game"] is None
