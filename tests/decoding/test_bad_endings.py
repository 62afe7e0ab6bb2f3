"""``forbid_bad_endings``: no caption ends on a bad word, neither at EOS nor where max_new_tokens cuts
it, in greedy and beam search, graphed or not; without the option the decoding is unchanged."""

import pytest
import torch

from captioning.decoding.generation import GenerationConfig
from captioning.decoding.search import generate
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.vocab import Vocabulary

EOS = Vocabulary.eos_id
V, D, L = 9, 5, 3
BAD = (5, 6)  # the decoder's "bad endings" ("of", "the")


class CutDecoder(ShowAttendTellDecoder):
    """A decoder that strongly favours the cycle 4 -> 5 -> 6 -> 4 ... and never ends: every caption
    runs into max_new_tokens, and at two steps in three the favoured last word is a bad one."""

    def step(self, tokens, state, mode=None, attention_temperature=1.0):
        logp, state, g = super().step(tokens, state, mode, attention_temperature)
        favoured = torch.where(tokens >= 4, 4 + (tokens - 4 + 1) % 3, torch.full_like(tokens, 4))
        bias = torch.zeros_like(logp).scatter(1, favoured.unsqueeze(1), 8.0)
        bias[:, EOS] = -8.0
        return torch.log_softmax(logp + bias, -1), state, g


@pytest.fixture
def decoder(make_decoder):
    return make_decoder(
        dtype=torch.float32, vocab_size=V, feature_dim=D, embed_dim=8, hidden_dim=16, bad_endings=BAD, cls=CutDecoder
    )


@pytest.fixture
def features():
    return torch.randn(4, L, D, generator=torch.Generator().manual_seed(1))


def captions(out) -> list[list[int]]:
    return [out.sequences[i, : int(out.lengths[i])].tolist() for i in range(out.sequences.size(0))]


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("limit", [2, 3, 7])  # the cycle's last word at the limit: 5 (bad), 6 (bad), 4
def test_a_caption_cut_by_the_limit_ends_on_a_good_word(decoder, features, beams, limit):
    plain = GenerationConfig(num_beams=beams, max_new_tokens=limit)
    before = captions(generate(decoder, features, plain))
    assert all(len(c) == limit and EOS not in c for c in before)  # every caption is cut
    if limit in (2, 3):
        assert all(c[-1] in BAD for c in before)  # the stumble: "... to the right of"
    after = captions(generate(decoder, features, plain.replace(forbid_bad_endings=True)))
    assert all(len(c) == limit and c[-1] not in BAD for c in after), after
    if beams == 1:  # greedy: only the cut word changes (beam search may prefer other beams for it)
        assert [c[:-1] for c in after] == [c[:-1] for c in before]
    if limit == 7:  # the last word was good already: nothing changes
        assert after == before


@pytest.mark.parametrize("beams", [1, 3])
def test_the_limit_rule_keeps_bad_words_inside_the_caption(decoder, features, beams):
    config = GenerationConfig(num_beams=beams, max_new_tokens=9, forbid_bad_endings=True)
    for c in captions(generate(decoder, features, config)):
        assert any(w in BAD for w in c[:-1]) and c[-1] not in BAD


def test_without_the_option_nothing_is_forbidden_at_the_limit(decoder, features):
    config = GenerationConfig(max_new_tokens=3)
    assert all(c[-1] == 6 for c in captions(generate(decoder, features, config)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("beams", [1, 3])
def test_the_graphed_loop_forbids_the_same(decoder, features, beams):
    decoder, features = decoder.cuda(), features.cuda()
    config = GenerationConfig(num_beams=beams, max_new_tokens=3, forbid_bad_endings=True)
    plain = generate(decoder, features, config)
    graphed = generate(decoder, features, config.replace(cuda_graphs=True))
    assert captions(graphed) == captions(plain)
    torch.testing.assert_close(graphed.scores, plain.scores)
