"""Scores beyond coco-caption: the captions' diversity (metrics/diversity.py) and the attention maps'
health (metrics/attention_health.py), on hand-made captions and maps, and through the Evaluator into
`captioning evaluate`'s report."""

import json
import logging
import math

import numpy as np
import pytest

from captioning.cli import main
from captioning.evaluation.evaluator import Evaluator
from captioning.metrics.attention_health import AttentionHealth, attention_health
from captioning.metrics.diversity import diversity_scores

CAPTIONS = {1: "a dog runs", 2: "A dog runs.", 3: "a cat sits", 4: "a cat"}


def test_diversity_of_a_hand_made_set():
    scores, warnings = diversity_scores(CAPTIONS, vocab_size=14, training_captions=["A dog runs", "a bird"])
    # words: [a dog runs] x2, [a cat sits], [a cat]: 11 words, 5 distinct; 7 bigrams, 4 distinct
    assert scores["distinct_1"] == pytest.approx(5 / 11)
    assert scores["distinct_2"] == pytest.approx(4 / 7)
    assert scores["vocabulary_used"] == 5.0
    assert scores["vocabulary_share"] == pytest.approx(5 / 10)  # 14 tokens less the 4 special ones
    assert scores["unique_captions"] == pytest.approx(2 / 4)  # "a cat sits" and "a cat" are no other image's
    assert scores["distinct_captions"] == pytest.approx(3 / 4)
    assert scores["top_caption_share"] == pytest.approx(2 / 4)
    assert scores["novel_captions"] == pytest.approx(2 / 4)  # "a dog runs" is a training caption
    assert scores["mean_length"] == pytest.approx(11 / 4)
    assert warnings == []  # 4 images say nothing about a dominant caption
    _, warnings = diversity_scores(CAPTIONS, min_images=4)
    assert len(warnings) == 1 and "50% of the images" in warnings[0] and "'a dog runs'" in warnings[0]


def test_a_dominant_caption_needs_enough_images_and_a_repeat():
    """The issue's case: 4 images of different captions ("25%" each) warn of nothing; a caption given to
    most of 10 or more images does; one caption per image never does, however few the images."""
    four = {1: "a dog", 2: "a cat", 3: "a bird", 4: "a fish"}
    scores, warnings = diversity_scores(four)
    assert scores["unique_captions"] == 1.0 and scores["top_caption_share"] == 0.25 and warnings == []
    assert diversity_scores(four, min_images=1)[1] == []  # a caption of one image is no repeat
    many = {i: "a dog" if i < 6 else f"a cat {i}" for i in range(12)}
    _, warnings = diversity_scores(many)
    assert len(warnings) == 1 and "50% of the images" in warnings[0]
    _, warnings = diversity_scores({i: c for i, c in many.items() if i >= 3})  # 9 images: too few to say
    assert warnings == []


def test_diversity_options_and_edges():
    scores, warnings = diversity_scores(CAPTIONS, dominant_share=0.5)
    assert warnings == [] and "novel_captions" not in scores and "vocabulary_share" not in scores
    assert diversity_scores({}) == ({}, [])
    scores, _ = diversity_scores({1: "dog", 2: "cat"})
    assert scores["distinct_2"] == 0.0 and scores["unique_captions"] == 1.0


def test_attention_health_warns_only_over_enough_captions():
    L = 4
    uniform = np.full((3, L), 1 / L)
    scores, warnings = attention_health([uniform] * 9)
    assert scores["attention_entropy_ratio"] == pytest.approx(1.0) and warnings == []
    _, warnings = attention_health([uniform] * 10)
    assert len(warnings) == 2 and "near uniform" in warnings[0] and "barely moves" in warnings[1]


def test_attention_health_of_uniform_frozen_and_moving_maps():
    L = 4
    uniform = np.full((3, L), 1 / L)
    scores, warnings = attention_health([uniform], min_captions=1)
    assert scores["attention_entropy"] == pytest.approx(math.log(L))
    assert scores["attention_entropy_ratio"] == pytest.approx(1.0)
    assert scores["attention_movement"] == pytest.approx(0.0)
    assert len(warnings) == 2 and "near uniform" in warnings[0] and "barely moves" in warnings[1]

    frozen = np.eye(L)[[2, 2, 2]]  # the same cell for every word
    scores, warnings = attention_health([frozen], min_captions=1)
    assert scores["attention_entropy"] == pytest.approx(0.0) and scores["attention_movement"] == pytest.approx(0.0)
    assert len(warnings) == 1 and "barely moves" in warnings[0]

    moving = np.eye(L)[[0, 1, 3]]
    scores, warnings = attention_health([moving])
    assert scores["attention_entropy_ratio"] == pytest.approx(0.0) and scores["attention_movement"] == pytest.approx(
        1.0
    )
    assert warnings == []

    half = np.array([[0.5, 0.5, 0, 0], [0, 0.5, 0.5, 0]])  # TV distance 0.5; entropy log 2 each
    scores, _ = attention_health([half, moving])
    assert scores["attention_entropy"] == pytest.approx(2 * math.log(2) / 5)
    assert scores["attention_movement"] == pytest.approx((0.5 + 1 + 1) / 3)


def test_attention_health_ignores_steps_beyond_each_caption():
    L = 4
    batch = np.zeros((2, 5, L))
    batch[0, :2] = np.eye(L)[[0, 1]]
    batch[1, :3] = np.eye(L)[[3, 3, 3]]
    batch[0, 2:] = 1 / L  # past the caption's end: ignored
    health = AttentionHealth()
    health.add(batch, np.array([2, 3]))
    scores, _ = health.scores()
    assert scores["attention_entropy"] == pytest.approx(0.0)
    assert scores["attention_movement"] == pytest.approx(1 / 3)  # pairs: (0->1) moves 1, (3->3) twice 0
    other = AttentionHealth()
    other.merge(AttentionHealth.caption_sums(batch, np.array([2, 3])).sum(0), L)
    assert other.scores() == health.scores()
    assert AttentionHealth().scores() == ({}, [])


#: 12 images, half of them captioned "a dog runs"
DOGS = {i: "a dog runs" if i < 6 else f"a cat sits on mat {i}" for i in range(12)}


def test_the_evaluator_scores_and_warns(caplog):
    evaluator = Evaluator((), training_captions=["a dog runs"], dominant_share=0.2)  # no coco-caption metrics here
    evaluator.health.add(np.full((12, 3, 9), 1 / 9), np.array([3, 3, 2, 1] * 3))
    with caplog.at_level(logging.WARNING):
        scores, notes = evaluator.score(DOGS, {i: ["x"] for i in DOGS})
    assert "CIDEr" not in scores and scores["novel_captions"] == pytest.approx(6 / 12)
    assert scores["attention_entropy_ratio"] == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in scores.values())  # validation logs every float
    assert "one caption covers" in notes["diversity_warning"] and "near uniform" in notes["attention_warning"]
    assert "one caption covers" in caplog.text and "near uniform" in caplog.text
    scores, notes = evaluator.score(DOGS, {i: ["x"] for i in DOGS})
    assert "attention_entropy" not in scores  # the maps are scored once


def test_the_evaluator_keeps_but_does_not_log_the_warnings_of_an_untrained_model(caplog):
    """Validation before the first step (Lightning's sanity check) scores with warn=False: the notes
    keep the warnings, the log stays quiet, and a later validation still warns (once)."""
    evaluator = Evaluator((), dominant_share=0.2)  # no coco-caption metrics here
    with caplog.at_level(logging.WARNING):
        _, notes = evaluator.score(DOGS, {i: ["x"] for i in DOGS}, warn=False)
    assert "one caption covers" in notes["diversity_warning"] and "one caption covers" not in caplog.text
    with caplog.at_level(logging.WARNING):
        evaluator.score(DOGS, {i: ["x"] for i in DOGS})
    assert caplog.text.count("one caption covers") == 1


def test_the_sanity_check_validation_warns_of_nothing(tiny_shapes, tmp_path, caplog):
    """Training's validation before the first step decodes with untrained weights (one repeated
    caption, uniform maps): nothing is logged about it; validation after training steps scores as usual."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    with caplog.at_level(logging.WARNING):
        cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=2, extra=["--trainer.num_sanity_val_steps", "2"]))
    assert cli.trainer.global_step == 2
    logged = [r.getMessage() for r in caplog.records if r.name == "captioning.evaluation.evaluator"]
    # the one validation after a step (8 images: too few for the diversity warning) may warn of attention only
    assert not any("one caption covers" in m for m in logged)
    assert sum("near uniform" in m for m in logged) <= 1


def test_evaluate_reports_diversity_and_attention(tiny_checkpoint, tiny_shapes, tmp_path, capsys):
    out = tmp_path / "metrics.json"
    code = main(
        [
            "evaluate",
            "--checkpoint",
            str(tiny_checkpoint),
            "--annotations",
            str(tiny_shapes),
            "--split",
            "test",
            "--num-beams",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    scores = report["scores"]
    for key in (
        "distinct_1",
        "distinct_2",
        "vocabulary_used",
        "vocabulary_share",
        "unique_captions",
        "novel_captions",
        "mean_length",
        "attention_entropy",
        "attention_entropy_ratio",
        "attention_movement",
    ):
        assert isinstance(scores[key], float), key
    assert 0 <= scores["novel_captions"] <= 1 and 0 < scores["attention_entropy_ratio"] <= 1.0 + 1e-9


class _FixedModel:
    """A stand-in model whose decoding returns given maps: one-hot maps moving across 4 cells."""

    attention_kind = "soft"

    def __init__(self):
        from captioning.vocab import Vocabulary

        self.vocab = Vocabulary(list(Vocabulary.SPECIALS) + ["a", "dog"])

    def features(self, batch):
        return batch["features"]

    def generate(self, features, config):
        import torch

        from captioning.decoding.search import GenerationOutput

        B = features.size(0)
        alphas = torch.eye(4)[[0, 1, 2]].expand(B, 3, 4).clone()
        return GenerationOutput(
            sequences=torch.tensor([[4, 5, 2]] * B),
            alphas=alphas,
            locations=alphas.argmax(-1),
            scores=torch.zeros(B),
            lengths=torch.full((B,), 3),
        )


def test_the_evaluator_counts_each_images_maps_once():
    import torch

    from captioning.decoding.generation import GenerationConfig

    evaluator, model = Evaluator(), _FixedModel()
    evaluator.add(model, {"features": torch.zeros(2, 4, 1), "image_ids": torch.tensor([1, 2])}, GenerationConfig())
    evaluator.add(
        model, {"features": torch.zeros(1, 4, 1), "image_ids": torch.tensor([2])}, GenerationConfig()
    )  # repeated
    assert evaluator.predictions(model.vocab) == {1: "a dog", 2: "a dog"}
    assert evaluator.health.sums.tolist() == [0.0, 6.0, 4.0, 4.0]  # 2 images x 3 maps, 2 moves of 1 each
    assert evaluator.vocab_size == 6


def test_known_captions_count_novel_captions_as_the_training_captions_do():
    from captioning.metrics.diversity import known_captions

    captions = {1: "A dog.", 2: "a cat on a mat", 3: "a bird"}
    training = ["a dog", "A cat on a mat."]
    assert diversity_scores(captions, known=known_captions(training))[0]["novel_captions"] == pytest.approx(1 / 3)
    assert diversity_scores(captions, training_captions=training)[0]["novel_captions"] == pytest.approx(1 / 3)


def test_validation_logs_novel_captions_and_says_why_clip_scores_are_missing(tiny_shapes, tmp_path, caplog):
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    with caplog.at_level(logging.WARNING):
        cli = run_lightning_cli(
            fit_args(
                tiny_shapes,
                tmp_path,
                steps=1,
                extra=["--model.clip_score.model", "NoSuchModel/x", "--model.clip_score.validation", "true"],
            )
        )
    logged = cli.trainer.callback_metrics
    assert 0 <= float(logged["val/novel_captions"]) <= 1
    assert "val/CLIPScore" not in logged
    assert any("CLIPScore unavailable" in r.getMessage() for r in caplog.records)


def test_the_evaluator_warns_once_per_kind_and_keeps_every_note(caplog):
    """A training run validates many times: each kind of warning is logged once, every score's notes keep it."""
    evaluator = Evaluator((), dominant_share=0.2)  # no coco-caption metrics here
    long_caption = " ".join(["a red circle to the right of"] * 5)
    captions = {i: long_caption for i in range(10)}
    logged = []
    for _ in range(3):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _, notes = evaluator.score(captions, {i: ["x"] for i in captions})
        assert "one caption covers" in notes["diversity_warning"]
        logged.append(caplog.text.count("one caption covers"))
    assert logged == [1, 0, 0]
    assert long_caption not in notes["diversity_warning"]  # a long degenerate caption is shortened
    assert "..." in notes["diversity_warning"]
