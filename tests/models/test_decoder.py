"""The LSTM decoder as written (models/decoder.py and the variants of models/attention/): each equals
the oracle transcribed from its equations (tests/oracle.py) in float64, values and gradients;
shapes, masking and padding; hard attention's sampling; the paper's parameter names."""

import pytest
import torch

from captioning.decoding.search import GenerationConfig, greedy_search
from captioning.errors import ConfigError
from captioning.models.decoder import DecoderConfig
from captioning.objectives.cross_entropy import caption_log_likelihood, doubly_stochastic_penalty
from tests import oracle
from tests.helpers import VARIANTS


def per_caption(out, captions):
    return caption_log_likelihood(out.logits, captions[:, 1:], out.mask)


def grads(loss, dec):
    return torch.autograd.grad(loss, list(dec.parameters()), allow_unused=True)


def assert_grads_close(dec, mine, theirs):
    for (name, _), a, b in zip(dec.named_parameters(), mine, theirs):
        if a is None or b is None:
            assert a is None and b is None, name
            continue
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)  # float64 sums in another order


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_decoder_equals_its_equations_in_value_and_gradient(variant, kind, make_decoder, make_batch):
    """Teacher forcing: log p(y | a), every alpha_t and beta_t, and the gradient of the NLL plus Eq. 14's
    penalty equal the oracle's; hard attention at given locations (some rows take the expected context)."""
    dec = make_decoder(attention_kind=kind, **VARIANTS[variant])
    features, captions, lengths = make_batch()
    heads = dec.config.heads
    T = captions.size(1) - 1
    locations = use_expected = None
    kwargs = {}
    if kind == "hard":
        locations = torch.randint(
            0, features.size(1), (4, T, heads) if heads > 1 else (4, T), generator=torch.Generator().manual_seed(1)
        )
        use_expected = torch.tensor([False, True, False, False])
        kwargs = dict(mode="sample", locations=locations, use_expected=use_expected)
    out = dec(features, captions, lengths, **kwargs)
    mine = per_caption(out, captions)
    alphas = out.head_alphas if heads > 1 else out.alphas.unsqueeze(2)
    penalty = doubly_stochastic_penalty(out.head_alphas if heads > 1 else out.alphas, out.mask)
    mine_grads = grads(mine.sum() - penalty.sum(), dec)

    refs = []
    for b in range(4):
        n = int(lengths[b]) - 1
        where = None
        if locations is not None:
            where = torch.full_like(locations[b, :n], -1) if use_expected[b] else locations[b, :n]
        refs.append(oracle.caption(dec, features[b], captions[b, : n + 1], where))
    theirs = torch.stack([r.log_likelihood for r in refs])
    theirs_grads = grads(theirs.sum() - torch.stack([r.penalty for r in refs]).sum(), dec)
    torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-10)
    for b, r in enumerate(refs):
        n = int(lengths[b]) - 1
        torch.testing.assert_close(alphas[b, :n], r.alphas, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.betas[b, :n], r.betas, rtol=1e-10, atol=1e-12)
        if kind == "hard":
            torch.testing.assert_close(out.location_log_probs[b, :n], r.location_log_probs, rtol=1e-10, atol=1e-12)
    assert_grads_close(dec, mine_grads, theirs_grads)


@pytest.mark.parametrize("variant", ["paper", "luong", "local", "multihead", "aoa"])
@pytest.mark.parametrize("kind,mode", [("soft", "expected"), ("hard", "expected"), ("hard", "argmax")])
def test_greedy_decoding_equals_the_equations_greedy_captions(variant, kind, mode, make_decoder, make_batch):
    if mode == "argmax" and variant == "multihead":
        pytest.skip("the oracle's argmax context is one head's")
    dec = make_decoder(attention_kind=kind, sharpen=3.0, eos=1.5, **VARIANTS[variant])
    features, _, _ = make_batch()
    out = greedy_search(dec, features, GenerationConfig(max_new_tokens=8, attention_mode=mode))
    for b in range(features.size(0)):
        words = oracle.greedy(dec, features[b], 8, mode)
        assert out.sequences[b, : len(words)].tolist() == words
        assert int(out.lengths[b]) == len(words)


def test_shapes_masking_and_the_gate(make_decoder, make_batch):
    dec = make_decoder()
    features, captions, lengths = make_batch()
    out = dec(features, captions, lengths)
    B, T = captions.size(0), captions.size(1) - 1
    assert out.logits.shape == (B, T, 13) and out.mask.sum(1).tolist() == (lengths - 1).tolist()
    assert out.alphas.shape == (B, T, features.size(1))
    real = out.alphas[out.mask].sum(-1)
    torch.testing.assert_close(real, torch.ones_like(real))  # alpha_t sums to one at real steps
    assert out.alphas[~out.mask].abs().sum() == 0 and out.betas[~out.mask].abs().sum() == 0
    assert ((out.betas > 0) & (out.betas < 1))[out.mask].all()  # one gate scalar per step


def test_padding_and_batch_order_change_nothing(make_decoder, make_batch):
    dec = make_decoder()
    features, captions, lengths = make_batch()
    out = per_caption(dec(features, captions, lengths), captions)
    padded = torch.cat([captions, torch.zeros(captions.size(0), 3, dtype=torch.long)], 1)
    torch.testing.assert_close(per_caption(dec(features, padded, lengths), padded), out)
    order = torch.tensor([2, 0, 3, 1])
    shuffled = per_caption(dec(features[order], captions[order], lengths[order]), captions[order])
    torch.testing.assert_close(shuffled, out[order])


def test_hard_attention_sampling_pass(make_decoder, make_batch):
    dec = make_decoder(attention_kind="hard")
    features, captions, lengths = make_batch()
    use_expected = torch.tensor([False, True, False, False])
    out = dec(features, captions, lengths, mode="sample", use_expected=use_expected)
    assert (out.location_log_probs[1] == 0).all()  # the row on the expected context samples nothing
    assert (out.location_log_probs[0][out.mask[0]] < 0).all()
    assert (out.entropies[out.mask] > 0).all() and (out.entropies[~out.mask] == 0).all()
    assert ((out.locations >= 0) & (out.locations < features.size(1))).all()


def test_doubly_stochastic_penalty_by_hand():
    alphas = torch.tensor([[[0.5, 0.5], [0.2, 0.8], [1.0, 0.0]], [[0.3, 0.7], [0.6, 0.4], [0.9, 0.1]]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # image 0: coverage (1.7, 1.3): 0.49 + 0.09; image 1: (0.9, 1.1) (the padded step ignored): 0.01 + 0.01
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, mask), torch.tensor([0.58, 0.02]))


def test_the_parameters_have_the_papers_names():
    paper = DecoderConfig(8, 12, 10).build(20, 16)
    assert sorted(paper.state_dict()) == sorted(
        [
            "E.weight",
            "W_init.weight",
            "W_init.bias",
            "f_att.W_a.weight",
            "f_att.W_a.bias",
            "f_att.W_h.weight",
            "f_att.w",
            "f_beta.weight",
            "f_beta.bias",
            "T.weight",
            "T.bias",
            "L_h.weight",
            "L_h.bias",
            "L_z.weight",
            "L_z.bias",
            "L_o.weight",
            "L_o.bias",
        ]
    )
    assert paper.T.weight.shape == (4 * 12, 8 + 12 + 16)  # [E y; h; z] -> i, f, g, o
    luong = DecoderConfig(8, 12, 10, score="scaled_dot", heads=2, placement="luong", window="local").build(20, 16)
    assert luong.T.weight.shape == (4 * 12, 8 + 12)
    assert sorted(k for k in luong.state_dict() if k not in paper.state_dict()) == sorted(
        [
            "f_att.W_q.weight",
            "f_att.W_q.bias",
            "f_att.W_k.weight",
            "f_att.W_k.bias",
            "window.W_p.weight",
            "window.W_p.bias",
            "window.v_p.weight",
            "window.v_p.bias",
            "multi_head.W_o.weight",
            "W_c.weight",
            "W_c.bias",
        ]
    )


@pytest.mark.parametrize(
    "settings,words",
    [
        (dict(score="cosine"), "model.decoder.score: unknown attention score 'cosine'"),
        (dict(window="near"), "model.decoder.window: unknown attention window 'near'"),
        (dict(placement="after"), "model.decoder.placement: unknown attention placement 'after'"),
        (dict(local_sigma=0.0), "model.decoder.local_sigma"),
        (dict(refiner_aoa=True), "model.decoder.refiner_aoa"),
        (dict(kind="transformer"), "model.decoder.kind"),
        (dict(dropout=1.0), "model.decoder.dropout"),
    ],
)
def test_bad_settings_are_one_line_errors(settings, words):
    with pytest.raises(ConfigError) as err:
        DecoderConfig(**settings)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)
