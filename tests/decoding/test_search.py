"""Batched greedy and beam search."""

import pytest
import torch

from captioning.decoding.search import GenerationConfig, beam_search, generate, greedy_search
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.vocab import Vocabulary
from tests.helpers import TINY_PATH, float32_tolerance

PAD, BOS, EOS = Vocabulary.pad_id, Vocabulary.bos_id, Vocabulary.eos_id
V, D, L = 12, 10, 6


@pytest.fixture
def decoder_of(make_decoder):
    """conftest's make_decoder at this file's sizes, float32."""
    return lambda **settings: make_decoder(
        dtype=torch.float32, vocab_size=V, feature_dim=D, embed_dim=8, hidden_dim=16, **settings
    )


@pytest.fixture
def decoder(decoder_of):
    return decoder_of(eos=2.5)  # captions of varied lengths, most ending well before the limit


@pytest.fixture
def features():
    return torch.randn(5, L, D, generator=torch.Generator().manual_seed(1))


def test_one_beam_equals_greedy(decoder, features):
    g = greedy_search(decoder, features, GenerationConfig(max_new_tokens=15))
    b = beam_search(decoder, features, GenerationConfig(num_beams=1, max_new_tokens=15))
    assert torch.equal(g.sequences, b.sequences)
    assert torch.equal(g.lengths, b.lengths)
    torch.testing.assert_close(g.scores, b.scores)
    torch.testing.assert_close(g.alphas, b.alphas)


@pytest.mark.parametrize("num_beams", [1, 3, 5])
def test_batched_equals_one_at_a_time(decoder, features, num_beams):
    batched = generate(decoder, features, GenerationConfig(num_beams=num_beams, max_new_tokens=15))
    for i in range(features.size(0)):
        single = generate(decoder, features[i : i + 1], GenerationConfig(num_beams=num_beams, max_new_tokens=15))
        n = int(single.lengths[0])
        assert int(batched.lengths[i]) == n
        assert batched.sequences[i, :n].tolist() == single.sequences[0, :n].tolist()
        torch.testing.assert_close(batched.scores[i], single.scores[0], **float32_tolerance(single.scores, TINY_PATH))
        torch.testing.assert_close(batched.alphas[i, :n], single.alphas[0, :n], **float32_tolerance(1.0, TINY_PATH))


@pytest.mark.parametrize("num_beams", [1, 4])
def test_finished_captions_stop(decoder, features, num_beams):
    out = generate(decoder, features, GenerationConfig(num_beams=num_beams, max_new_tokens=15))
    assert (out.lengths < 15).any(), "the test needs captions that end early"
    for seq, n, att in zip(out.sequences, out.lengths.tolist(), out.alphas):
        if n < 15 or seq[n - 1] == EOS:
            assert seq[n - 1] == EOS and EOS not in seq[: n - 1].tolist()
        assert (seq[n:] == PAD).all(), "nothing follows EOS but padding"
        assert att[n:].abs().sum() == 0 and torch.allclose(att[:n].sum(-1), torch.ones(n))


@pytest.mark.parametrize("num_beams", [1, 3])
def test_score_is_the_normalised_log_likelihood_of_the_returned_caption(decoder, features, num_beams):
    out = generate(decoder, features, GenerationConfig(num_beams=num_beams, max_new_tokens=15, length_penalty=1.0))
    T = out.sequences.size(1)
    captions = torch.cat([torch.full((features.size(0), 1), BOS), out.sequences], 1)
    forced = decoder(features, captions, out.lengths + 1)
    ll = caption_log_likelihood(forced.logits, captions[:, 1:], forced.mask)
    torch.testing.assert_close(out.scores, ll / out.lengths.float(), **float32_tolerance(ll, TINY_PATH))
    assert T <= 15


def test_beam_search_finds_likelier_captions_than_greedy(decoder, features):
    with torch.no_grad():
        decoder.L_o.bias[EOS] -= 10.0  # no caption ends: all have max_new_tokens tokens
    g = generate(decoder, features, GenerationConfig(num_beams=1, max_new_tokens=6, length_penalty=0.0))
    b = generate(decoder, features, GenerationConfig(num_beams=5, max_new_tokens=6, length_penalty=0.0))
    assert (b.scores >= g.scores - 1e-5).all() and (b.scores > g.scores + 1e-4).any()


def test_sampling_is_seeded_and_respects_top_k(decoder, features):
    kw = dict(num_beams=1, max_new_tokens=10, do_sample=True, temperature=1.0)
    a = generate(decoder, features, GenerationConfig(**kw), generator=torch.Generator().manual_seed(3))
    b = generate(decoder, features, GenerationConfig(**kw), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.sequences, b.sequences)
    top1 = generate(decoder, features, GenerationConfig(top_k=1, **kw), generator=torch.Generator().manual_seed(4))
    greedy = generate(decoder, features, GenerationConfig(num_beams=1, max_new_tokens=10))
    assert torch.equal(top1.sequences, greedy.sequences)


def test_hard_attention_modes_decode(features, decoder_of):
    dec = decoder_of(attention_kind="hard")
    for mode in ("expected", "argmax", "sample"):
        out = generate(dec, features, GenerationConfig(num_beams=3, max_new_tokens=8, attention_mode=mode))
        assert out.sequences.shape[0] == 5 and ((out.locations >= 0) & (out.locations < L)).all()
    am = generate(dec, features, GenerationConfig(num_beams=1, max_new_tokens=8, attention_mode="argmax"))
    n = am.lengths
    for i in range(5):
        assert torch.equal(am.locations[i, : n[i]], am.alphas[i, : n[i]].argmax(-1))


def test_attention_temperature_moves_the_expected_context_towards_the_argmax_cell(features, decoder_of):
    """A hard model's tempered expected context: tau 1 is the expected context, a tiny tau the argmax
    cell's (the same captions and scores as "argmax" mode), a middle tau neither; the maps returned are
    the model's alpha in every case, and soft models ignore it."""
    from captioning.models.decoder import glimpse

    alpha = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0, 0.0]])
    sharp = torch.softmax(alpha.clamp_min(1e-12).log() / 0.5, -1)
    torch.testing.assert_close(sharp, (alpha**2) / (alpha**2).sum())  # softmax(2 log alpha) = alpha^2 / sum
    feats = torch.randn(1, L, D)
    g = glimpse(alpha, feats, "expected", temperature=0.5)
    torch.testing.assert_close(g.context, sharp @ feats[0])
    assert torch.equal(g.alpha, alpha) and int(g.location) == 0

    dec = decoder_of(attention_kind="hard", eos=2.5)

    def run(**kw):
        return generate(dec, features, GenerationConfig(num_beams=3, max_new_tokens=8, **kw))

    expected, argmax = run(), run(attention_mode="argmax")
    assert not torch.equal(expected.scores, argmax.scores)
    one = run(attention_temperature=1.0)
    assert torch.equal(one.sequences, expected.sequences) and torch.equal(one.scores, expected.scores)
    cold = run(attention_temperature=1e-4)
    assert torch.equal(cold.sequences, argmax.sequences)
    torch.testing.assert_close(cold.scores, argmax.scores)
    torch.testing.assert_close(cold.alphas, argmax.alphas)  # the model's maps, not the tempered weights
    middle = run(attention_temperature=0.5)
    assert not torch.allclose(middle.scores, expected.scores) and not torch.allclose(middle.scores, argmax.scores)

    soft = decoder_of()
    a = generate(soft, features, GenerationConfig(num_beams=3, max_new_tokens=8))
    b = generate(soft, features, GenerationConfig(num_beams=3, max_new_tokens=8, attention_temperature=0.1))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.scores, b.scores)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "0.5"])
def test_attention_temperature_must_be_a_positive_number(bad):
    from captioning.errors import ConfigError

    with pytest.raises(ConfigError, match="attention_temperature: expected a finite number > 0"):
        GenerationConfig(attention_temperature=bad)


def test_sampled_locations_follow_alpha_and_the_seed(features, decoder_of):
    """Hard attention's "sample" mode reads a location drawn from alpha: seeded, not always the
    argmax, and never a location alpha gives no weight."""
    dec = decoder_of(attention_kind="hard")
    config = GenerationConfig(num_beams=1, max_new_tokens=8, attention_mode="sample")
    many = features.repeat(8, 1, 1)  # 40 rows: enough draws to see more than the argmax

    def run(seed):
        torch.manual_seed(seed)
        return generate(dec, many, config)

    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a.locations, b.locations) and torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.locations, c.locations)
    first = a.alphas[:, 0]  # (rows, L): step 0 of every row, before any caption ended
    chosen = first.gather(1, a.locations[:, :1]).squeeze(1)
    assert (chosen > 0).all()
    assert (a.locations[:, 0] != first.argmax(-1)).any()
