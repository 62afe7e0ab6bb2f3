"""Scores of captions in CJK scripts: BLEU, ROUGE-L and CIDEr-D on Chinese words (jieba, or one token
per character without it), METEOR reported unavailable with its reason, the tokens named in the
scores and the evaluator's notes, and SCST's CIDEr-D reward on the same tokens."""

import importlib.util

import numpy as np
import torch
from pycocoevalcap.cider.cider import Cider

from captioning.metrics.coco import CocoScorer
from captioning.metrics.languages import scoring_tokenizer, tokenize_corpus
from captioning.objectives.scst import SCST
from captioning.tokenizers import build_tokenizer
from captioning.vocab import Vocabulary

REFERENCES = {
    1: ["左上角有一个红色的星形", "一个红色的星形在左上角"],
    2: ["一个蓝色的圆形在中间", "中间有一个蓝色的圆形"],
    3: ["两只猫坐在沙发上", "沙发上有两只猫"],
}
PREDICTIONS = {1: "左上角有一个红色的星形", 2: "中间有一个红色的圆形", 3: "一个蓝色的星形"}
EXPECTED = "jieba" if importlib.util.find_spec("jieba") else "chars"


def test_chinese_captions_are_scored_on_chinese_words_and_say_so():
    scores = CocoScorer()(REFERENCES, PREDICTIONS)
    assert scores["tokens"] == EXPECTED
    assert scores["METEOR"] is None and "English" in scores["METEOR_error"] and "\n" not in scores["METEOR_error"]
    # the scorers see the tokenizer's words: the same CIDEr-D as pycocoevalcap's on those words
    words = build_tokenizer(EXPECTED)
    gts = tokenize_corpus(words, REFERENCES)
    res = {i: [" ".join(words.tokenize(PREDICTIONS[i]))] for i in REFERENCES}
    expected, _ = Cider().compute_score(gts, res)
    assert abs(scores["CIDEr"] - expected) < 1e-9
    assert scores["BLEU-1"] > 0.5  # PTB would keep each caption whole: no word of image 2 would match
    english = CocoScorer(metrics=("BLEU", "CIDEr"))({1: ["a red star"]}, {1: "a red star"})
    assert "tokens" not in english  # English scores keep their keys (the evaluator's notes name "ptb")


def test_english_captions_keep_the_ptb_tokens():
    assert scoring_tokenizer(["a red star in the top left", "a 红 star"]) is None
    assert scoring_tokenizer(REFERENCES[1]).name == EXPECTED


def test_scst_rewards_chinese_captions_on_the_same_words():
    objective = SCST()
    objective.set_references(REFERENCES)
    chars = build_tokenizer("chars")
    vocab = Vocabulary.build([chars.tokenize(c) for refs in REFERENCES.values() for c in refs], 1, tokenizer="chars")
    rows = [vocab.encode(chars.tokenize(PREDICTIONS[i]))[1:] for i in REFERENCES]
    sequences = torch.full((len(rows), max(map(len, rows))), vocab.pad_id)
    for k, row in enumerate(rows):
        sequences[k, : len(row)] = torch.tensor(row)
    rewards, _ = objective.rewards(vocab, sequences, [objective._references[i] for i in REFERENCES])
    words = build_tokenizer(EXPECTED)
    expected = objective.cider.scores(
        [" ".join(words.tokenize(PREDICTIONS[i])) for i in REFERENCES], [objective._references[i] for i in REFERENCES]
    )
    np.testing.assert_allclose(rewards, expected, atol=1e-9)
    assert rewards[0] > rewards[1] > rewards[2] == 0  # the reference itself, one word off, another image's words


def test_diversity_counts_chinese_words():
    from captioning.metrics.diversity import diversity_scores

    scores, _ = diversity_scores(PREDICTIONS, training_captions=["一个蓝色的星形"])
    words = build_tokenizer(EXPECTED)
    assert scores["mean_length"] == sum(len(words.tokenize(c)) for c in PREDICTIONS.values()) / 3 > 3
    assert scores["distinct_2"] > 0 and scores["novel_captions"] == 2 / 3  # image 3's caption is a training one
