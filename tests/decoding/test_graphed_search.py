"""The search with GenerationConfig.cuda_graphs (decoding/search.py, the loop of every search:
captured on CUDA, run as it is on a CPU) gives the same captions, scores, lengths and attention maps
as without it; and the capture helper runs plain functions off CUDA. (On a CPU both configs run the
same loop: what these tests check there is that the option changes nothing; the search itself is
tested in test_search.py and test_attention_variants.py.)"""

import dataclasses

import pytest
import torch

from captioning.cuda_graphs import ShapeGraphs, graphs_available
from captioning.decoding.search import GenerationConfig, generate

V, D, L = 17, 12, 9
EOS_LUONG = 2.5


@pytest.fixture
def decoder_of(make_decoder):
    """conftest's make_decoder at this file's sizes, float32, sharper words and EOS likelier (captions
    that end at different steps), with bad endings."""
    return lambda eos=1.0, **variant: make_decoder(
        dtype=torch.float32, vocab_size=V, sharpen=4.0, eos=eos, bad_endings=(5, 6), **variant
    )


CASES = [
    ("soft", {}, {}),
    ("hard_expected", dict(attention_kind="hard"), dict(attention_mode="expected")),
    ("hard_argmax", dict(attention_kind="hard"), dict(attention_mode="argmax")),
    ("heads_luong", dict(heads=2, placement="luong", score="scaled_dot", eos=EOS_LUONG), {}),
    ("forbid", {}, dict(forbid_bad_endings=True)),
    ("no_repeat_ngram", {}, dict(no_repeat_ngram_size=2)),
    ("repetition_penalty", {}, dict(repetition_penalty=1.3)),
    ("min_new_suppress", {}, dict(min_new_tokens=2, suppress_tokens=(4, 7))),
]


@pytest.mark.parametrize("name,variant,generation", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("beams", [1, 3, 5])
def test_graphed_search_equals_the_plain_search(decoder_of, name, variant, generation, beams):
    decoder = decoder_of(**variant)
    features = torch.randn(7, L, D, generator=torch.Generator().manual_seed(1))
    config = GenerationConfig(num_beams=beams, max_new_tokens=14, **generation)
    plain = generate(decoder, features, config)
    graphed = generate(decoder, features, dataclasses.replace(config, cuda_graphs=True))
    # captions of several lengths, so that cutting the loop where the plain search stops is tested
    # (the untrained two-head Luong model may end every beam together at some beam counts)
    assert plain.lengths.min() < plain.lengths.max() or name == "heads_luong"
    for field in dataclasses.fields(plain):
        a, b = getattr(plain, field.name), getattr(graphed, field.name)
        assert (a is None) == (b is None), field.name
        pairs = [(f"{field.name}.{k}", a[k], b[k]) for k in a] if isinstance(a, dict) else [(field.name, a, b)]
        if isinstance(a, dict):
            assert a.keys() == b.keys(), field.name
        for name, x, y in pairs if a is not None else ():
            assert x.shape == y.shape, name
            torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7, msg=name)


def test_graphed_beam_search_returns_several_sequences(decoder_of):
    decoder = decoder_of()
    features = torch.randn(4, L, D, generator=torch.Generator().manual_seed(2))
    config = GenerationConfig(num_beams=4, num_return_sequences=3, max_new_tokens=10)
    plain, graphed = generate(decoder, features, config), generate(decoder, features, config.replace(cuda_graphs=True))
    assert torch.equal(plain.beam_sequences, graphed.beam_sequences)
    torch.testing.assert_close(plain.beam_scores, graphed.beam_scores)


def test_graphed_diverse_beam_search(decoder_of):
    decoder = decoder_of()
    features = torch.randn(5, L, D, generator=torch.Generator().manual_seed(3))
    config = GenerationConfig(
        num_beams=4,
        num_beam_groups=2,
        diversity_penalty=0.8,
        num_return_sequences=4,
        max_new_tokens=12,
        no_repeat_ngram_size=3,
    )
    plain, graphed = generate(decoder, features, config), generate(decoder, features, config.replace(cuda_graphs=True))
    assert torch.equal(plain.beam_sequences, graphed.beam_sequences)
    torch.testing.assert_close(plain.beam_scores, graphed.beam_scores, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(plain.alphas, graphed.alphas, rtol=1e-6, atol=1e-7)


def test_sampling_is_not_captured_and_keeps_its_draws(decoder_of):
    decoder = decoder_of()
    features = torch.randn(3, L, D)
    config = GenerationConfig(do_sample=True, max_new_tokens=8, top_p=0.8)
    a = generate(decoder, features, config, torch.Generator().manual_seed(5))
    b = generate(decoder, features, config.replace(cuda_graphs=True), torch.Generator().manual_seed(5))
    assert torch.equal(a.sequences, b.sequences)


def test_shape_graphs_run_the_function_off_cuda():
    calls = []

    def fn(x, y):
        calls.append(x.shape)
        return x * 2 + y, x.sum()

    graphs = ShapeGraphs(fn)
    out = graphs(torch.ones(3), torch.arange(3.0))
    assert torch.equal(out[0], torch.tensor([2.0, 3.0, 4.0])) and out[1] == 3
    assert graphs.last is None and not graphs.graphs and len(calls) == 1  # nothing captured on a CPU
    assert not graphs_available("cpu")
