"""Attention faithfulness: deletion and insertion of annotation vectors (decoding/faithfulness.py)."""

import pytest
import torch

from captioning.decoding.faithfulness import (
    FRACTIONS,
    _last_step_log_probs,
    batch_faithfulness,
    removal_mask,
    summarise,
    teacher_inputs,
    word_rows,
)
from captioning.vocab import Vocabulary
from tests.helpers import TINY_PATH, float32_tolerance

BOS, EOS = Vocabulary.bos_id, Vocabulary.eos_id
V, D, L = 12, 10, 16


@pytest.fixture
def decoder_of(make_decoder):
    """conftest's make_decoder at this file's sizes: ``decoder_of(kind="soft", dtype=torch.float32)``."""
    return lambda kind="soft", dtype=torch.float32: make_decoder(
        dtype=dtype, vocab_size=V, feature_dim=D, embed_dim=8, hidden_dim=16, attention_kind=kind
    )


@pytest.fixture
def captions_of(make_batch):
    """``captions_of(dtype=torch.float32)``: four images (conftest's features, times 3) and captions of
    5, 1, 3 and 7 words as a search returns them (the words, EOS, padding: (B, 8)), with their lengths."""

    def make(dtype=torch.float32):
        features, captions, lengths = make_batch(B=4, seed=1, dtype=dtype, L=L, D=D, V=V, lengths=(7, 3, 5, 9))
        return 3 * features, captions[:, 1:], lengths - 1  # without BOS

    return make


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_removing_none_changes_nothing(kind, decoder_of, captions_of):
    dec = decoder_of(kind)
    features, seqs, lengths = captions_of()
    result = batch_faithfulness(dec, features, seqs, lengths, BOS, fractions=(0.0, 0.5), removals=("mean",))
    rows = result["rows"]
    assert rows.token.numel() > 0
    # a pass with an empty removal mask gives the unperturbed log-probabilities exactly
    captions, full = teacher_inputs(seqs, lengths, BOS)
    again = _last_step_log_probs(dec, features[rows.image], captions[rows.image], rows.step + 2, rows.token)
    torch.testing.assert_close(again, rows.log_prob, **float32_tolerance(rows.log_prob, TINY_PATH))
    assert torch.equal(result["mean", "top", 0], rows.log_prob)
    assert not torch.allclose(result["mean", "top", 8], rows.log_prob), "removing half must change something"


def test_removing_all_is_the_image_free_language_model(decoder_of, captions_of):
    dec = decoder_of()
    features, seqs, lengths = captions_of()
    result = batch_faithfulness(dec, features, seqs, lengths, BOS, fractions=(0.0, 1.0), removals=("zero", "mean"))
    rows = result["rows"]
    captions, full = teacher_inputs(seqs, lengths, BOS)
    with torch.no_grad():  # the whole captions under zero vectors: the model with no image
        out = dec(torch.zeros_like(features), captions, full)
    lp = torch.log_softmax(out.step_logits, -1).gather(1, captions[:, 1:][out.mask].unsqueeze(1))[:, 0]
    r, s = out.mask.nonzero(as_tuple=True)
    lm = {(int(i), int(t)): float(v) for i, t, v in zip(r, s, lp)}
    expected = torch.tensor([lm[int(i), int(t)] for i, t in zip(rows.image, rows.step)])
    torch.testing.assert_close(result["zero", "top", L], expected, **float32_tolerance(expected, TINY_PATH))
    # removing every vector with the mean leaves each image's mean at every location: the order does not matter
    assert torch.equal(result["mean", "random", L], result["mean", "top", L])


def test_batched_equals_a_loop_over_words_in_float64(decoder_of, captions_of):
    dec = decoder_of(dtype=torch.float64)
    features, seqs, lengths = captions_of(torch.float64)
    g = torch.Generator().manual_seed(3)
    result = batch_faithfulness(
        dec, features, seqs, lengths, BOS, fractions=(0.25,), removals=("mean", "zero"), generator=g
    )
    rows = result["rows"]
    captions, full = teacher_inputs(seqs, lengths, BOS)
    with torch.no_grad():
        for removal in ("mean", "zero"):
            for order in ("top", "least"):
                remove = removal_mask(rows, 4, order)
                for n in range(rows.token.numel()):  # one word at a time, its whole image and caption prefix
                    b, t = int(rows.image[n]), int(rows.step[n])
                    image = features[b].clone()
                    fill = image.mean(0) if removal == "mean" else torch.zeros(D, dtype=torch.float64)
                    image[remove[n]] = fill
                    out = dec(image[None], captions[b : b + 1, : t + 2], torch.tensor([t + 2]))
                    lp = torch.log_softmax(out.step_logits[-1], -1)[rows.token[n]]
                    assert abs(float(lp) - float(result[removal, order, 4][n])) < 1e-12


def test_ranking_follows_the_attention(decoder_of, captions_of):
    dec = decoder_of()
    features, seqs, lengths = captions_of()
    captions, full = teacher_inputs(seqs, lengths, BOS)
    rows = word_rows(dec, features, captions, full)
    with torch.no_grad():
        alphas = dec(features, captions, full).alphas[rows.image, rows.step]  # (N, L)
    top = removal_mask(rows, 3, "top")
    least = removal_mask(rows, 3, "least")
    assert (top.sum(1) == 3).all() and not (top & least).any()
    assert (alphas[top].view(-1, 3).min(1).values >= alphas[least].view(-1, 3).max(1).values).all()


def test_summary_curves_and_areas(decoder_of, captions_of):
    dec = decoder_of()
    features, seqs, lengths = captions_of()
    result = batch_faithfulness(dec, features, seqs, lengths, BOS, removals=("mean",))
    report = summarise([result], L, FRACTIONS, ("mean",), word_class=lambda tok: "even" if tok % 2 == 0 else "odd")
    cls = report["removal"]["mean"]
    assert cls["all"]["words"] == result["rows"].token.numel() == report["words"]
    assert sum(c["words"] for name, c in cls.items() if name != "all") == cls["all"]["words"]
    curve = cls["all"]["deletion"]["top"]
    assert len(curve) == len(FRACTIONS)
    assert curve[0] == pytest.approx(float(result["rows"].log_prob.exp().mean()))
    # insertion keeping everything is the unperturbed probability; keeping nothing is deletion of all
    assert cls["all"]["insertion"]["top"][-1] == pytest.approx(curve[0])
    assert cls["all"]["insertion"]["top"][0] == pytest.approx(curve[-1])
    assert 0 < cls["all"]["area"]["deletion_top"] < 1
