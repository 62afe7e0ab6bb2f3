"""The fast paths agree with plain references at moderate sizes; no timing asserts.

- The teacher-forced pass (sorted batch, shrinking active rows, fused hidden products, output
  layer once over real steps) gives the same losses and gradients as captioning.models.reference,
  the paper's equations one caption and one step at a time: soft attention, and hard attention
  with forced locations (and rows that take the expected context). The model runs in float64;
  caption_log_likelihood casts logits to float32, so the log-likelihood and the gradients are
  compared at float32 tolerance, the other terms at float64 tolerance.
- Greedy decoding equals the reference's greedy captions (soft; hard in modes expected and argmax).
- DeferredLinear (one weight-gradient product after the loop) gives the plain layer's gradients,
  and FirstRows (the steps' gradients of a tensor's first rows summed in one buffer) plain slicing's.
- The attention scores, computed through tanh(y) = 2 sigmoid(2y) - 1 (and, when decoding on the
  CPU, a few images at a time), equal the plain tanh formula, in value and in gradient.
- Batched generation equals one image at a time for hard attention and a larger decoder
  (tests/decoding/test_search.py covers the small soft decoder).
"""

import pytest
import torch

from captioning.decoding.search import GenerationConfig, generate, greedy_search
from captioning.models import attention as attention_module
from captioning.models import reference as paper
from captioning.models.decoder import DecoderConfig, ShowAttendTellDecoder
from captioning.objectives.cross_entropy import caption_log_likelihood, doubly_stochastic_penalty
from captioning.vocab import Vocabulary
from tests.helpers import TINY_PATH, float32_tolerance

PAD, BOS, EOS = Vocabulary.pad_id, Vocabulary.bos_id, Vocabulary.eos_id
V, D, L, H, M, A = 50, 32, 49, 64, 48, 40
LENGTHS = [9, 3, 14, 2, 6, 11]  # tokens incl. BOS and EOS, unsorted, one caption of a single step


def make_decoder(attention: str) -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    return (
        ShowAttendTellDecoder(
            V, D, DecoderConfig(embed_dim=M, hidden_dim=H, attention_dim=A, dropout=0.0, attention_kind=attention)
        )
        .double()
        .eval()
    )


def make_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B = len(LENGTHS)
    features = torch.randn(B, L, D, generator=g, dtype=torch.float64)
    lengths = torch.tensor(LENGTHS)
    captions = torch.full((B, max(LENGTHS) + 2), PAD)  # extra padding columns on purpose
    for b, n in enumerate(LENGTHS):
        captions[b, 0] = BOS
        captions[b, 1 : n - 1] = torch.randint(3, V, (n - 2,), generator=g)
        captions[b, n - 1] = EOS
    T = captions.size(1) - 1
    locations = torch.randint(0, L, (B, T), generator=g)
    use_expected = torch.tensor([False, True, False, False, True, False])
    weights = torch.randn(B, T, generator=g, dtype=torch.float64)  # fixed coefficients of log p(s_t)
    return features, captions, lengths, locations, use_expected, weights


def reference(dec, features, captions, lengths, locations=None, use_expected=None) -> list[paper.Caption]:
    """Each caption through models/reference.py: its real steps, the forced locations where given
    (-1, the expected context, in the rows of ``use_expected``)."""
    weights = paper.Weights.of(dec)
    out = []
    for b in range(features.size(0)):
        n = int(lengths[b]) - 1
        where = None
        if locations is not None:
            where = torch.full((n,), -1) if bool(use_expected[b]) else locations[b, :n]
        out.append(paper.caption(weights, features[b], captions[b, : n + 1], where))
    return out


def grads(loss, dec):
    return torch.autograd.grad(loss, list(dec.parameters()), allow_unused=True)


def assert_grads_close(dec, fast, slow):
    # float32 rounding of sums of the gradients' terms: its scale is the largest gradient's (a gradient
    # that is zero up to rounding, as the score bias's under the softmax, is a sum of such terms)
    tolerance = float32_tolerance(torch.cat([g.flatten() for g in slow if g is not None]), TINY_PATH)
    for (name, _), gf, gs in zip(dec.named_parameters(), fast, slow):
        if gf is None or gs is None:
            assert gf is None and gs is None, name
            continue
        torch.testing.assert_close(gf, gs, **tolerance, msg=name)


def test_soft_fast_pass_equals_reference_in_loss_and_gradient():
    features, captions, lengths, *_ = make_batch()
    dec = make_decoder("soft")
    out = dec(features, captions, lengths)
    ll = caption_log_likelihood(out.logits, captions[:, 1:], out.mask)
    pen = doubly_stochastic_penalty(out.alphas, out.mask)
    ref = reference(dec, features, captions, lengths)
    ll_ref = torch.stack([r.log_likelihood for r in ref])
    pen_ref = torch.stack([r.penalty for r in ref])
    torch.testing.assert_close(ll.double(), ll_ref, rtol=1e-6, atol=1e-5)  # the loss works in float32
    for b, r in enumerate(ref):  # the maps and gates, step by step
        n = len(r.betas)
        torch.testing.assert_close(out.alphas[b, :n], r.alphas, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(out.betas[b, :n], r.betas, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(pen, pen_ref, rtol=1e-9, atol=1e-9)
    loss, loss_ref = -ll.mean() + pen.mean(), -ll_ref.mean() + pen_ref.mean()
    assert_grads_close(dec, grads(loss, dec), grads(loss_ref, dec))


def test_hard_fast_pass_with_forced_locations_equals_reference():
    features, captions, lengths, locations, use_expected, w = make_batch(1)
    dec = make_decoder("hard")
    out = dec(features, captions, lengths, mode="sample", use_expected=use_expected, locations=locations)
    mask = out.mask
    # the forced locations are the ones used and reported
    assert torch.equal(out.locations[mask], locations[mask])
    ll = caption_log_likelihood(out.logits, captions[:, 1:], mask)
    pen = doubly_stochastic_penalty(out.alphas, mask)
    log_ps = out.location_log_probs * mask
    ents = out.entropies * mask
    ref = reference(dec, features, captions, lengths, locations, use_expected)
    ll_ref = torch.stack([r.log_likelihood for r in ref])
    pen_ref = torch.stack([r.penalty for r in ref])
    log_ps_ref = torch.zeros_like(log_ps)
    ents_ref = torch.zeros_like(ents)
    for b, r in enumerate(ref):
        n = len(r.location_log_probs)
        log_ps_ref[b, :n] = r.location_log_probs
        ents_ref[b, :n] = r.entropies
    torch.testing.assert_close(ll.double(), ll_ref, rtol=1e-6, atol=1e-5)  # the loss works in float32
    torch.testing.assert_close(pen, pen_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(log_ps, log_ps_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ents, ents_ref, rtol=1e-9, atol=1e-9)
    assert (log_ps[use_expected] == 0).all()
    # the Eq. 12 surrogate's pieces: NLL, weighted log p(s), entropy, plus the penalty
    loss = -ll.sum() + pen.sum() + (w * log_ps).sum() + 0.01 * ents.sum()
    loss_ref = -ll_ref.sum() + pen_ref.sum() + (w * log_ps_ref).sum() + 0.01 * ents_ref.sum()
    assert_grads_close(dec, grads(loss, dec), grads(loss_ref, dec))


@pytest.mark.parametrize("attention,mode", [("soft", "expected"), ("hard", "expected"), ("hard", "argmax")])
def test_greedy_decoding_equals_the_references_greedy_captions(attention, mode):
    dec = make_decoder(attention)
    with torch.no_grad():
        dec.out_logits.bias[EOS] += 0.6  # captions of varied lengths
    features = make_batch(4)[0]
    out = greedy_search(dec, features, GenerationConfig(max_new_tokens=12, attention_mode=mode))
    weights = paper.Weights.of(dec)
    lengths = set()
    for b in range(features.size(0)):
        with torch.no_grad():
            words = paper.greedy(weights, features[b], 12, hard=mode)
        n = int(out.lengths[b])
        lengths.add(n)
        assert out.sequences[b, :n].tolist() == words  # EOS included, where the caption ended
    assert len(lengths) > 1


def test_the_reference_is_the_papers_model_only():
    dec = ShowAttendTellDecoder(V, D, DecoderConfig(embed_dim=M, hidden_dim=H, attention_dim=A, heads=2))
    with pytest.raises(ValueError, match="paper's model"):
        paper.Weights.of(dec)


def test_fast_pass_is_independent_of_batch_order_and_padding():
    features, captions, lengths, locations, use_expected, _ = make_batch(2)
    dec = make_decoder("hard")
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    a = dec(features, captions, lengths, mode="sample", use_expected=use_expected, locations=locations)
    b = dec(
        features[perm],
        captions[perm, :-2],
        lengths[perm],
        mode="sample",
        use_expected=use_expected[perm],
        locations=locations[perm, :-2],
    )
    ll_a = caption_log_likelihood(a.logits, captions[:, 1:], a.mask)
    ll_b = caption_log_likelihood(b.logits, captions[perm, 1:-2], b.mask)
    torch.testing.assert_close(ll_a[perm], ll_b, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a.alphas[perm, :-2], b.alphas, rtol=1e-10, atol=1e-10)


def test_attention_scores_equal_the_tanh_formula_in_value_and_gradient(monkeypatch):
    torch.manual_seed(0)
    B, K = 7, 3
    att = attention_module.AdditiveAttention(D, H, A).double()
    features = torch.randn(B, L, D, dtype=torch.float64, requires_grad=True)
    hidden = torch.randn(B * K, A, dtype=torch.float64, requires_grad=True)

    def plain():  # Eq. 4-5 as written: softmax(w^T tanh(W_a a + W_h h + b) + b_w)
        x = att.feature_proj(features).unsqueeze(1) + hidden.view(B, K, 1, A)
        return torch.softmax(att.score(torch.tanh(x)).view(B * K, L), dim=-1)

    weights = torch.randn(B * K, L, dtype=torch.float64)
    ref = plain()
    ref_grads = torch.autograd.grad((ref * weights).sum(), [features, hidden, *att.parameters()])
    alpha = att(att.project(features), hidden, beams=K)
    torch.testing.assert_close(alpha, ref, rtol=1e-10, atol=1e-12)
    got_grads = torch.autograd.grad((alpha * weights).sum(), [features, hidden, *att.parameters()])
    for g, r in zip(got_grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-12)
    with torch.no_grad():
        whole = att(att.project(features), hidden, beams=K)
        monkeypatch.setattr(attention_module, "CPU_CHUNK_ELEMENTS", 2 * K * L * A + 1)  # chunks of 2 images, 1 left
        chunked = att(att.project(features), hidden, beams=K)
    torch.testing.assert_close(whole, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(chunked, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "attention,mode,num_beams,chunk_images",
    [
        ("hard", "argmax", 1, None),
        ("hard", "argmax", 3, None),
        ("hard", "expected", 3, None),
        ("soft", None, 5, None),
        ("soft", None, 5, 2),
        ("soft", None, 1, 3),
    ],
)
def test_batched_generation_equals_one_at_a_time_moderate_sizes(attention, mode, num_beams, chunk_images, monkeypatch):
    if chunk_images:  # the batched decoding computes its attention scores a few images at a time
        monkeypatch.setattr(attention_module, "CPU_CHUNK_ELEMENTS", chunk_images * num_beams * L * A)
    dec = make_decoder(attention).float()
    with torch.no_grad():
        dec.out_logits.bias[EOS] += 3.0  # captions of varied lengths
    features = torch.randn(7, L, D, generator=torch.Generator().manual_seed(3))
    batched = generate(
        dec, features, GenerationConfig(num_beams=num_beams, max_new_tokens=12, attention_mode=mode or "expected")
    )
    for i in range(features.size(0)):
        single = generate(
            dec,
            features[i : i + 1],
            GenerationConfig(num_beams=num_beams, max_new_tokens=12, attention_mode=mode or "expected"),
        )
        n = int(single.lengths[0])
        assert int(batched.lengths[i]) == n
        assert batched.sequences[i, :n].tolist() == single.sequences[0, :n].tolist()
        assert batched.locations[i, :n].tolist() == single.locations[0, :n].tolist()
        torch.testing.assert_close(batched.scores[i], single.scores[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batched.alphas[i, :n], single.alphas[0, :n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias,autocast", [(True, False), (False, False), (True, True)])
def test_deferred_linear_gives_the_gradients_of_the_plain_layer(bias, autocast):
    """A recurrent loop over shrinking rows: DeferredLinear's one weight-gradient product equals
    autograd's per-step gradients (and under bf16 autocast, agrees at bf16 precision)."""
    from captioning.models.deferred import DeferredLinear

    torch.manual_seed(0)
    layer = torch.nn.Linear(12, 12, bias=bias)
    x0 = torch.randn(6, 12, requires_grad=True)
    rows = [6, 6, 4, 3, 1]

    def run(product):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            h, total = x0, 0.0
            for t, n in enumerate(rows):
                h = torch.tanh(product(h[:n])) + 0.1 * h[:n]
                total = total + (h.float() * (t + 1)).sum()
        return torch.autograd.grad(total, [x0, *layer.parameters()])

    plain = run(layer)
    deferred_layer = DeferredLinear(layer)
    deferred = run(deferred_layer)
    for a, b in zip(deferred, plain):
        if autocast:  # both round to bf16, at different places: compare as a whole
            assert (a - b).norm() <= 1e-2 * b.norm()
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not deferred_layer.rows.grads  # the rows were used and released


def test_first_rows_give_the_gradients_of_plain_slicing():
    """A loop whose step t reads the first n_t rows of x, which is also used outside the loop (as the
    features are by W_a a and the initial state): FirstRows' one gradient buffer equals autograd's
    per-slice gradients, and the buffer is released after the backward pass."""
    from captioning.models.deferred import FirstRows

    torch.manual_seed(0)
    x0 = torch.randn(6, 5, 3, requires_grad=True)
    w = torch.randn(3)
    rows = [6, 6, 4, 3, 3, 1]

    def run(first_rows):
        x = x0 * 2  # a non-leaf, as the encoder's features are
        h, total = torch.zeros(6, 5), (x.mean(1) ** 2).sum()  # a use outside the loop
        for t, n in enumerate(rows):
            h = torch.tanh(first_rows(x, n) @ w + h[:n])
            total = total + (h * (t + 1)).sum()
        return torch.autograd.grad(total, x0)[0]

    plain = run(lambda x, n: x[:n])
    shared = {}

    def deferred(x, n):
        if "rows" not in shared:
            shared["rows"] = FirstRows(x)
        return shared["rows"](n)

    torch.testing.assert_close(run(deferred), plain, rtol=1e-6, atol=1e-6)
    assert shared["rows"].total.grad is None  # handed on and released
    with torch.no_grad():  # without autograd: plain rows
        assert FirstRows(x0)(2).equal(x0[:2])
