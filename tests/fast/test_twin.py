"""The fast path (captioning/fast/) is the plain model, faster: in float64 its teacher-forced passes
(the shrinking batch, Luong's whole sequence, the static pass, scheduled sampling) give the plain
decoder's losses and gradients, and every search its captions, scores and maps, soft and hard, for
every variant; its speed pieces each equal what they replace; a form it does not know runs plain,
saying so in one line."""

import logging

import pytest
import torch

from captioning.decoding.search import GenerationConfig, generate
from captioning.fast import MIRRORED, FastModel, edited, fast_decoder, fast_model, fingerprint
from captioning.fast import lstm as fast_lstm
from captioning.fast.gradients import DeferredLinear, FirstRows
from captioning.fast.lstm import FastLSTM, additive_scores
from captioning.models.decoder import AdditiveScore, ShowAttendTellDecoder
from captioning.objectives.cross_entropy import caption_log_likelihood
from tests.helpers import TWIN_VARIANTS as VARIANTS


def loss_and_grads(run, dec, features, captions, lengths, **kwargs):
    """The NLL plus the attention maps' squares (so that alpha's gradient counts) and every gradient."""
    out = run(features, captions, lengths, **kwargs)
    alphas = out.head_alphas if out.head_alphas is not None else out.alphas
    loss = -caption_log_likelihood(out.logits, captions[:, 1:], out.mask).sum() + (alphas**2).sum()
    return out, loss, torch.autograd.grad(loss, list(dec.parameters()), allow_unused=True)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", ["soft", "hard"])
@pytest.mark.parametrize("static", [False, True])
def test_teacher_forcing_equals_the_plain_decoder(variant, kind, static, make_decoder, make_batch):
    dec = make_decoder(attention_kind=kind, **VARIANTS[variant])
    twin = FastLSTM(dec)
    features, captions, lengths = make_batch()
    kwargs = {}
    if kind == "hard":
        heads, T = dec.config.heads, captions.size(1) - 1
        where = torch.randint(
            0, features.size(1), (4, T, heads) if heads > 1 else (4, T), generator=torch.Generator().manual_seed(2)
        )
        kwargs = dict(mode="sample", locations=where, use_expected=torch.tensor([True, False, False, True]))
    plain, plain_loss, plain_grads = loss_and_grads(dec, dec, features, captions, lengths, **kwargs)
    fast, fast_loss, fast_grads = loss_and_grads(twin, dec, features, captions, lengths, static=static, **kwargs)
    torch.testing.assert_close(fast_loss, plain_loss, rtol=1e-11, atol=1e-11)
    for name, value in (
        ("alphas", "alphas"),
        ("betas", "betas"),
        ("locations", "locations"),
        ("head_alphas", "head_alphas"),
        ("log_probs", "location_log_probs"),
    ):
        a, b = getattr(fast, value), getattr(plain, value)
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=name)
    for (name, _), a, b in zip(dec.named_parameters(), fast_grads, plain_grads):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("variant", ["paper", "luong", "multihead", "local_aoa"])
def test_scheduled_sampling_draws_what_the_plain_decoder_draws(variant, make_decoder, make_batch):
    settings = dict(window="local", aoa=True) if variant == "local_aoa" else VARIANTS[variant]
    dec = make_decoder(**settings)
    features, captions, lengths = make_batch()
    torch.manual_seed(7)
    plain = dec(features, captions, lengths, sample_prob=0.5)
    torch.manual_seed(7)
    fast = FastLSTM(dec)(features, captions, lengths, sample_prob=0.5)
    torch.testing.assert_close(fast.logits, plain.logits, rtol=1e-11, atol=1e-11)


SEARCHES = [
    ("greedy", {}),
    ("beam3", dict(num_beams=3)),
    ("beam5_two_returned", dict(num_beams=5, num_return_sequences=2)),
    ("diverse", dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5)),
    ("blocked_ngrams", dict(num_beams=3, no_repeat_ngram_size=2, repetition_penalty=1.3)),
    ("sampled", dict(do_sample=True, top_k=5)),
]


@pytest.mark.parametrize("variant", ["paper", "scaled_dot", "multihead", "luong_local_heads", "refiner_aoa"])
@pytest.mark.parametrize(
    "kind,mode", [("soft", "expected"), ("hard", "expected"), ("hard", "argmax"), ("hard", "sample")]
)
@pytest.mark.parametrize("search", [s[0] for s in SEARCHES])
def test_every_search_equals_the_plain_decoders(variant, kind, mode, search, make_decoder, make_batch):
    dec = make_decoder(attention_kind=kind, sharpen=3.0, eos=1.0, bad_endings=(5, 6), **VARIANTS[variant])
    features, _, _ = make_batch(B=3)
    config = GenerationConfig(max_new_tokens=7, attention_mode=mode, forbid_bad_endings=True, **dict(SEARCHES)[search])
    outs = []
    for decoder in (dec, FastLSTM(dec)):
        torch.manual_seed(11)  # hard attention's sampled locations
        outs.append(generate(decoder, features, config, torch.Generator().manual_seed(3)))
    plain, fast = outs
    assert torch.equal(fast.sequences, plain.sequences) and torch.equal(fast.lengths, plain.lengths)
    torch.testing.assert_close(fast.scores, plain.scores, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(fast.alphas, plain.alphas, rtol=1e-11, atol=1e-12)
    assert torch.equal(fast.locations, plain.locations)
    if plain.beam_sequences is not None:
        assert torch.equal(fast.beam_sequences, plain.beam_sequences)


@pytest.mark.parametrize("beams,chunk_images", [(1, None), (3, None), (5, 2), (1, 3)])
def test_the_chunked_scores_decode_as_the_whole_batch(beams, chunk_images, make_decoder, make_batch, monkeypatch):
    """Decoding on the CPU scores a few images at a time: the same captions batched or one at a time."""
    if chunk_images:
        monkeypatch.setattr(fast_lstm, "CPU_CHUNK_ELEMENTS", chunk_images * beams * 9 * 8)
    twin = FastLSTM(make_decoder(dtype=torch.float32, sharpen=3.0, eos=3.0))
    features, _, _ = make_batch(B=6, dtype=torch.float32)
    config = GenerationConfig(num_beams=beams, max_new_tokens=10)
    batched = generate(twin, features, config)
    for i in range(features.size(0)):
        one = generate(twin, features[i : i + 1], config)
        n = int(one.lengths[0])
        assert batched.sequences[i, :n].tolist() == one.sequences[0, :n].tolist()
        torch.testing.assert_close(batched.scores[i], one.scores[0], rtol=1e-5, atol=1e-5)


def test_the_sigmoid_form_equals_the_tanh_formula_in_value_and_gradient(monkeypatch):
    """e = (2w)^T sigmoid(2y) - sum(w) is w^T tanh(y), with one head or several, with and without
    autograd (the chunked, in-place path)."""
    torch.manual_seed(0)
    B, K, L, D, H, A = 5, 3, 9, 6, 7, 8
    for heads in (1, 2):
        score = AdditiveScore(D, H, A, heads).double()
        features = torch.randn(B, L, D, dtype=torch.float64, requires_grad=True)
        h = torch.randn(B * K, H, dtype=torch.float64, requires_grad=True)
        inputs = [features, h, *score.parameters()]
        plain = score(score.project(features), h, beams=K)
        fast = additive_scores(score.project(features), score.query(h), score.w, beams=K)
        torch.testing.assert_close(fast, plain, rtol=1e-12, atol=1e-12)
        weights = torch.randn(plain.shape, dtype=torch.float64)
        for a, b in zip(
            torch.autograd.grad((fast * weights).sum(), inputs), torch.autograd.grad((plain * weights).sum(), inputs)
        ):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    score = AdditiveScore(D, H, A).double()
    with torch.no_grad():
        plain = score(score.project(features), h, beams=K)
        monkeypatch.setattr(fast_lstm, "CPU_CHUNK_ELEMENTS", 2 * K * L * A + 1)  # chunks of 2 images, 1 left over
        chunked = additive_scores(score.project(features), score.query(h), score.w, beams=K)
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("group", [1, 3])
def test_luongs_pass_is_the_same_whatever_the_grouping(group, make_decoder, make_batch, monkeypatch):
    dec = make_decoder(**VARIANTS["luong_local_heads"])
    features, captions, lengths = make_batch()
    _, loss, grads = loss_and_grads(FastLSTM(dec), dec, features, captions, lengths)
    monkeypatch.setattr(fast_lstm, "LUONG_GROUP", group)
    _, loss2, grads2 = loss_and_grads(FastLSTM(dec), dec, features, captions, lengths)
    torch.testing.assert_close(loss2, loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads2, grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_static_pass_samples_graph_safely(make_decoder, make_batch, monkeypatch):
    """The static pass draws s_t from random numbers a CUDA graph replays (argmax alpha / Exp(1)),
    never with torch.multinomial; the default pass samples with torch.multinomial."""
    dec = make_decoder(attention_kind="hard", heads=2)
    features, captions, lengths = make_batch()
    twin = FastLSTM(dec)
    calls = []
    original = torch.multinomial
    monkeypatch.setattr(torch, "multinomial", lambda *a, **k: calls.append(1) or original(*a, **k))
    twin(features, captions, lengths, mode="sample", static=True)
    assert not calls
    twin(features, captions, lengths, mode="sample")
    assert calls


def test_graph_safe_draws_follow_alpha():
    alpha = torch.tensor([[0.1, 0.6, 0.3]]).repeat(20000, 1)
    counts = torch.bincount(fast_lstm.sample_location(alpha, torch.Generator().manual_seed(0)), minlength=3)
    torch.testing.assert_close(counts / 20000.0, alpha[0], atol=0.015, rtol=0)  # 3 binomial sd at n = 20,000


@pytest.mark.parametrize("bias,autocast", [(True, False), (False, False), (True, True)])
def test_deferred_linear_gives_the_gradients_of_the_plain_product(bias, autocast):
    torch.manual_seed(0)
    layer = torch.nn.Linear(12, 12, bias=bias)
    x0 = torch.randn(6, 12, requires_grad=True)

    def run(product):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h, total = x0, 0.0
            for t, n in enumerate([6, 6, 4, 3, 1]):
                h = torch.tanh(product(h[:n])) + 0.1 * h[:n]
                total = total + (h.float() * (t + 1)).sum()
        return torch.autograd.grad(total, [x0, *layer.parameters()])

    plain = run(layer)
    deferred_layer = DeferredLinear(layer.weight, layer.bias)
    deferred = run(deferred_layer)
    for a, b in zip(deferred, plain):
        if autocast:  # both round to bf16 at different places: compared as a whole, at bf16's precision
            assert (a - b).norm() <= 1e-2 * b.norm()
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not deferred_layer.rows.grads  # the rows were used and released


def test_first_rows_give_the_gradients_of_plain_slicing():
    torch.manual_seed(0)
    x0 = torch.randn(6, 5, 3, requires_grad=True)
    w = torch.randn(3)

    def run(first_rows):
        x = x0 * 2
        h, total = torch.zeros(6, 5), (x.mean(1) ** 2).sum()  # a use outside the loop
        for t, n in enumerate([6, 6, 4, 3, 3, 1]):
            h = torch.tanh(first_rows(x, n) @ w + h[:n])
            total = total + (h * (t + 1)).sum()
        return torch.autograd.grad(total, x0)[0]

    shared = {}

    def deferred(x, n):
        shared.setdefault("rows", FirstRows(x))
        return shared["rows"](n)

    torch.testing.assert_close(run(deferred), run(lambda x, n: x[:n]), rtol=1e-6, atol=1e-6)
    assert shared["rows"].total.grad is None  # handed on and released


# ---------------------------------------------------------------------- which form runs
def test_the_fingerprints_are_the_sources():
    """MIRRORED records the source the twin was written for: after changing a mirrored piece of the
    plain model, update the twin, check it with this file's tests, then `python -m captioning.fast`."""
    assert {name: fingerprint(name) for name in MIRRORED} == MIRRORED
    assert edited() == ()


def test_a_subclass_runs_plain_and_says_so(make_decoder, make_batch, caplog):
    """A researcher's vector gate beta_t (D,) in a subclass: trained and decoded by the plain model."""

    class VectorGate(ShowAttendTellDecoder):
        def __init__(self, vocab_size, feature_dim, config=None):
            super().__init__(vocab_size, feature_dim, config)
            self.f_beta = torch.nn.Linear(self.hidden_dim, feature_dim)

    paper = make_decoder()
    dec = VectorGate(13, 12, paper.config).double().eval()
    with caplog.at_level(logging.WARNING, logger="captioning.fast"):
        assert fast_decoder(dec) is dec
    assert "VectorGate is a subclass of the paper's decoder" in caplog.text
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
    features, captions, lengths = make_batch()
    out = dec(features, captions, lengths)
    assert out.betas.shape == (4, captions.size(1) - 1, 12)  # one gate per feature
    caption_log_likelihood(out.logits, captions[:, 1:], out.mask).sum().backward()
    assert dec.f_beta.weight.grad is not None
    assert generate(dec, features, GenerationConfig(num_beams=2, max_new_tokens=4)).sequences.shape[0] == 4


def test_an_edited_module_runs_plain_and_says_so(make_decoder, monkeypatch, caplog):
    dec = make_decoder()
    plain_attend = ShowAttendTellDecoder.attend

    def attend(self, h, state, mode, use_expected=None, location=None, temperature=1.0):  # an edit: a sharper softmax
        return plain_attend(self, 2 * h, state, mode, use_expected, location, temperature)

    monkeypatch.setattr(ShowAttendTellDecoder, "attend", attend)
    edited.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="captioning.fast"):
            assert fast_decoder(dec) is dec
        assert "ShowAttendTellDecoder.attend differs from the code the fast path mirrors" in caplog.text
    finally:
        monkeypatch.undo()
        edited.cache_clear()
    assert isinstance(fast_decoder(dec), FastLSTM)


def test_the_commands_model_is_the_twin_and_the_models_own_call_is_plain(tiny_model, monkeypatch):
    model = tiny_model()
    fast = fast_model(model)
    assert isinstance(fast, FastModel) and isinstance(fast.decoder, FastLSTM) and fast.vocab is model.vocab
    assert list(fast.parameters()) == list(model.parameters())  # the model's own, nothing copied
    calls, step = [], FastLSTM.step
    monkeypatch.setattr(FastLSTM, "step", lambda self, *a, **k: calls.append(1) or step(self, *a, **k))
    images, config = torch.rand(2, 3, 32, 32), GenerationConfig(max_new_tokens=3)
    model.eval()
    plain = model.generate(images=images, config=config)
    assert not calls  # model.generate runs the plain decoder
    twin = fast.generate(images=images, config=config)
    assert calls and torch.equal(twin.sequences, plain.sequences)


@pytest.mark.parametrize("variant", ["paper", "luong_local_heads"])
def test_the_twin_follows_the_parameters_as_they_train(variant, make_decoder, make_batch):
    """Fused Adam changes the parameters in place without bumping their version counters: after each
    step the twin's search is still the plain decoder's (nothing fused is kept between searches)."""
    dec = make_decoder(sharpen=3.0, eos=1.0, **VARIANTS[variant])
    twin = FastLSTM(dec)
    features, captions, lengths = make_batch()
    optimizer = torch.optim.Adam(dec.parameters(), lr=0.05, fused=True)
    config = GenerationConfig(num_beams=2, max_new_tokens=6)
    for _ in range(3):
        with torch.no_grad():
            before = generate(twin, features, config)
        out = twin(features, captions, lengths)
        loss = -caption_log_likelihood(out.logits, captions[:, 1:], out.mask).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            plain, fast = generate(dec, features, config), generate(twin, features, config)
        torch.testing.assert_close(fast.scores, plain.scores, rtol=1e-11, atol=1e-11)
        assert not torch.allclose(fast.scores, before.scores)  # the step changed the model
