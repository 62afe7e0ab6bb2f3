"""The attention variants (score functions, heads, Luong placement, local window, refiner): each
fast teacher-forced pass equals a plain step-by-step reference written from the equations (float64,
values and gradients; with every variant setting at the paper's value it is models/reference.py's
model), one head is the single-head model, the local window is a normalised window at the predicted
centre, batched beam search equals per-image beam search, and old checkpoints still load as the
paper's model."""

import math

import pytest
import torch
import torch.nn.functional as F

from captioning.decoding.search import GenerationConfig, beam_search, greedy_search
from captioning.models import reference as paper
from captioning.models import unroll
from captioning.models.attention import (
    AdditiveAttention,
    ScaledDotAttention,
    gaussian_window,
    glimpse,
    multihead_additive_scores,
    window_log,
)
from captioning.models.decoder import DecoderConfig, ShowAttendTellDecoder
from captioning.objectives.cross_entropy import CrossEntropy, doubly_stochastic_penalty
from tests.helpers import TINY_PATH, float32_tolerance

V, D, GRID = 13, 12, 3  # vocabulary, feature width (= hidden_dim, for the dot score), 3 x 3 grid
L = GRID * GRID

VARIANTS = {
    "dot": dict(score="dot"),
    "general": dict(score="general"),
    "scaled_dot": dict(score="scaled_dot"),
    "multihead": dict(heads=2),
    "multihead_dot": dict(score="dot", heads=3),
    "luong": dict(placement="luong"),
    "local": dict(window="local", local_sigma=0.8),
    "refiner": dict(refiner_layers=1, refiner_heads=2),
    "luong_local_heads": dict(placement="luong", window="local", heads=2, score="scaled_dot"),
    "aoa": dict(aoa=True),
    "refiner_aoa": dict(refiner_layers=1, refiner_heads=2, refiner_aoa=True),
    "luong_aoa_heads": dict(placement="luong", aoa=True, heads=2),
}


def make_decoder(dtype=torch.float64, **variant) -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    config = DecoderConfig(embed_dim=6, hidden_dim=D, attention_dim=8, dropout=0.0, **variant)
    return ShowAttendTellDecoder(V, D, config).to(dtype)


def make_batch(B=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(B, L, D, generator=g, dtype=dtype)
    lengths = torch.tensor([7, 4, 6, 3][:B])
    captions = torch.zeros(B, 7, dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        captions[b, 0] = 1
        captions[b, 1 : n - 1] = torch.randint(4, V, (n - 2,), generator=g)
        captions[b, n - 1] = 2
    return features, captions, lengths


# ---------------------------------------------------------------------- the reference, from the equations
def ref_scores(dec, a, h, q):
    """e (heads, L) for one row: a (L, D), h (H,), q the decoder's query projection of h."""
    att, K, score = dec.f_att, dec.heads, dec.config.score
    if score == "additive":
        y = a @ att.feature_proj.weight.T + att.feature_proj.bias + q  # W_a a_i + b + W_h h
        A = y.size(1) // K
        w, b = att.score.weight.reshape(K, A), att.score.bias.reshape(K)
        return torch.stack([torch.tanh(y[:, k * A : (k + 1) * A]) @ w[k] + b[k] for k in range(K)])
    if score == "dot":
        keys, query, scale = a, h, 1.0
    elif score == "general":
        keys, query, scale = a @ att.key_proj.weight.T, h, 1.0
    else:
        keys, query = a @ att.key_proj.weight.T + att.key_proj.bias, q
        scale = 1 / math.sqrt(keys.size(1) // K)
    d = keys.size(1) // K
    return torch.stack([keys[:, k * d : (k + 1) * d] @ query[k * d : (k + 1) * d] * scale for k in range(K)])


def ref_attend(dec, a, h, from_h):
    """alpha (heads, L) and z (D,) of one row from [W_h h | f_beta h | W_p h] = from_h."""
    Q, _, P = dec.attention_splits
    q, beta_pre, w_p_h = from_h[:Q], from_h[Q], from_h[Q + 1 : Q + 1 + P]
    e = ref_scores(dec, a, h, q)
    alpha = torch.softmax(e, dim=-1)  # (heads, L)
    if dec.local:  # Luong's local-p on the grid: alpha times the Gaussian window, renormalised
        v = dec.local_centre.v_p
        centre = (GRID - 1) * torch.sigmoid(v.weight @ torch.tanh(w_p_h) + v.bias)  # (row, column)
        cells = torch.tensor([(r, c) for r in range(GRID) for c in range(GRID)], dtype=a.dtype)
        window = torch.exp(-((cells - centre) ** 2).sum(1) / (2 * dec.config.local_sigma**2))
        alpha = alpha * window
        alpha = alpha / alpha.sum(-1, keepdim=True)
    contexts = alpha @ a  # (heads, D): sum_i alpha_ki a_i
    z = contexts.reshape(-1)
    if dec.head_proj is not None:
        z = dec.head_proj.weight @ z  # W_o [z^1; ...; z^K]
    if dec.aoa is not None:  # Attention on Attention: i * sigmoid(g), [i; g] = W [z; h] + b
        info, gate = (dec.aoa.weight @ torch.cat([z, h]) + dec.aoa.bias).chunk(2)
        z = info * torch.sigmoid(gate)
    return alpha, torch.sigmoid(beta_pre) * z


def lstm_cell(x, h, c, w_ih, w_hh, b):
    i, f, g, o = (w_ih @ x + w_hh @ h + b).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def reference(dec, features, captions, lengths):
    """log p(y | a) per caption (B,) and the alphas (B, T, heads, L), one caption and one step at a time."""
    H, T = dec.hidden_dim, captions.size(1) - 1
    lls, alphas = [], torch.zeros(captions.size(0), T, dec.heads, L, dtype=features.dtype)
    for b in range(captions.size(0)):
        a = features[b]
        if dec.refiner is not None:  # the refiner (standard Transformer layers), once per image
            a = dec.refiner(a.unsqueeze(0))[0]
        h, c = torch.tanh(dec.init_state.weight @ a.mean(0) + dec.init_state.bias).chunk(2)
        ll = 0.0
        for t in range(int(lengths[b]) - 1):
            y_prev = dec.embedding.weight[captions[b, t]]
            if dec.luong:  # LSTM on E y_{t-1}, then attention from h_t, h~_t = tanh(W_c [z_t; h_t])
                lstm = dec.lstm
                h, c = lstm_cell(y_prev, h, c, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)
                alpha, z = ref_attend(dec, a, h, dec.from_output.weight @ h + dec.from_output.bias)
                h_out = torch.tanh(dec.combine.weight @ torch.cat([z, h]) + dec.combine.bias)
            else:  # attention from h_{t-1}, then the LSTM on [E y_{t-1}; h_{t-1}; z_t]
                fh = dec.from_hidden.weight @ h + dec.from_hidden.bias
                n_att = sum(dec.attention_splits)
                alpha, z = ref_attend(dec, a, h, fh[:n_att])
                w_ih = torch.cat([dec.embed_gates.weight, dec.context_gates.weight], 1)
                h, c = lstm_cell(torch.cat([y_prev, z]), h, c, w_ih, torch.zeros(4 * H, H, dtype=a.dtype), fh[n_att:])
                h_out = h
            x = (
                dec.out_hidden.weight @ h_out
                + dec.out_hidden.bias
                + y_prev
                + dec.out_context.weight @ z
                + dec.out_context.bias
            )
            logits = dec.out_logits.weight @ torch.tanh(x) + dec.out_logits.bias
            ll = ll + torch.log_softmax(logits, -1)[captions[b, t + 1]]
            alphas[b, t] = alpha
        lls.append(ll)
    return torch.stack(lls), alphas


def fast(dec, features, captions, lengths):
    out = dec(features, captions, lengths)
    token_ll = -F.cross_entropy(out.logits, captions[:, 1:][out.mask], reduction="none")
    per_caption = torch.zeros(out.mask.shape, dtype=token_ll.dtype).masked_scatter(out.mask, token_ll).sum(1)
    alphas = out.head_alphas if out.head_alphas is not None else out.alphas.unsqueeze(2)
    return per_caption, alphas, out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_pass_equals_step_by_step_reference_in_value_and_gradient(variant):
    dec = make_decoder(**VARIANTS[variant]).eval()
    features, captions, lengths = make_batch()
    ll, alphas, out = fast(dec, features, captions, lengths)
    ll_ref, alphas_ref = reference(dec, features, captions, lengths)
    torch.testing.assert_close(ll, ll_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(alphas, alphas_ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.alphas, alphas_ref.mean(2), rtol=1e-9, atol=1e-9)  # the mean over heads
    params = [p for p in dec.parameters()]
    g_fast = torch.autograd.grad(ll.sum(), params, allow_unused=True)
    g_ref = torch.autograd.grad(ll_ref.sum(), params, allow_unused=True)
    for (name, _), a, b in zip(dec.named_parameters(), g_fast, g_ref):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=name)
    assert any(g is not None and g.abs().sum() > 0 for g in g_fast)


def test_the_variants_reference_at_the_papers_settings_is_the_papers_model():
    """The two oracles agree: this file's reference of the variants, with every variant setting at
    the paper's value, is models/reference.py (log-likelihood and maps)."""
    dec = make_decoder().eval()
    features, captions, lengths = make_batch()
    ll_ref, alphas_ref = reference(dec, features, captions, lengths)
    weights = paper.Weights.of(dec)
    for b in range(features.size(0)):
        n = int(lengths[b])
        one = paper.caption(weights, features[b], captions[b, :n])
        torch.testing.assert_close(one.log_likelihood, ll_ref[b], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(one.alphas, alphas_ref[b, : n - 1, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["luong", "multihead", "local"])
def test_hard_sampling_with_forced_locations_equals_the_log_probabilities_per_head(variant):
    dec = make_decoder(attention_kind="hard", **VARIANTS[variant]).eval()
    features, captions, lengths = make_batch()
    K = dec.heads
    B, T = captions.size(0), captions.size(1) - 1
    locations = torch.randint(0, L, (B, T, K), generator=torch.Generator().manual_seed(1))
    out = dec(features, captions, lengths, mode="sample", locations=locations if K > 1 else locations[..., 0])
    alphas = out.head_alphas if K > 1 else out.alphas.unsqueeze(2)  # (B, T, K, L)
    # log p(s_t | a) is the sum over the heads of log alpha_tk[s_tk]: each head samples on its own
    chosen = alphas.gather(-1, locations.unsqueeze(-1)).squeeze(-1)  # (B, T, K); 0 at padded steps
    expected = torch.where(out.mask, torch.log(chosen.clamp_min(1e-300)).sum(-1), 0.0)
    torch.testing.assert_close(out.location_log_probs, expected)
    assert out.locations.shape == ((B, T, K) if K > 1 else (B, T))
    assert torch.equal(out.locations.view(B, T, K)[out.mask], locations[out.mask])
    # sampled locations follow alpha: a head never picks a location of (near) zero weight
    sampled = dec(features, captions, lengths, mode="sample")
    assert torch.isfinite(sampled.location_log_probs).all() and (sampled.entropies >= 0).all()


# ---------------------------------------------------------------------- one head, the window
def test_one_head_equals_the_single_head_model():
    torch.manual_seed(0)
    att = AdditiveAttention(D, D, 8).double()
    projected = att.project(torch.randn(3, L, D, dtype=torch.float64))
    h_att = torch.randn(3 * 2, 8, dtype=torch.float64)
    single = att.scores(projected, h_att, beams=2)  # (6, L): the paper's path
    multi = multihead_additive_scores(projected, h_att, att.score.weight, att.score.bias, 2, heads=1)  # one head
    torch.testing.assert_close(multi[:, 0], single)
    dot = ScaledDotAttention(D, D, 8, heads=1).double()
    keys = dot.project(torch.randn(3, L, D, dtype=torch.float64))
    torch.testing.assert_close(
        dot.scores(keys, h_att, 2), (h_att.view(3, 2, 8) @ keys.transpose(1, 2) / math.sqrt(8)).reshape(6, L)
    )
    # a glimpse of one head is the single-head glimpse, in every mode
    features = torch.randn(3, L, D, dtype=torch.float64)
    alpha = torch.softmax(torch.randn(6, L, dtype=torch.float64), -1)
    for mode in ("expected", "argmax"):
        one, plain = glimpse(alpha.unsqueeze(1), features, mode, beams=2), glimpse(alpha, features, mode, beams=2)
        torch.testing.assert_close(one.context, plain.context)
        torch.testing.assert_close(one.alpha, plain.alpha)
    location = torch.randint(0, L, (6,))
    one = glimpse(alpha.unsqueeze(1), features, "sample", location=location.unsqueeze(1), beams=2)
    plain = glimpse(alpha, features, "sample", location=location, beams=2)
    torch.testing.assert_close(one.context, plain.context)
    torch.testing.assert_close(one.log_prob, plain.log_prob)
    # a one-head decoder is the default decoder, parameter for parameter (no projection, no new layers)
    assert make_decoder(heads=1).state_dict().keys() == make_decoder().state_dict().keys()


def test_multi_head_contexts_are_each_heads_expected_context():
    features = torch.randn(2, L, D, dtype=torch.float64)
    alpha = torch.softmax(torch.randn(2 * 3, 4, L, dtype=torch.float64), -1)  # 2 images x 3 beams, 4 heads
    g = glimpse(alpha, features, "expected", beams=3)
    by_hand = torch.einsum("nkl,nld->nkd", alpha, features.repeat_interleave(3, 0)).reshape(6, 4 * D)
    torch.testing.assert_close(g.context, by_hand)
    torch.testing.assert_close(g.alpha, alpha.mean(1))


def test_local_window_sums_to_one_and_peaks_at_the_predicted_centre():
    side = 7
    centres = torch.tensor([[0.0, 0.0], [3.2, 4.9], [6.0, 1.4], [2.5001, 2.4999]], dtype=torch.float64)
    for sigma in (0.5, 1.5, 4.0):
        w = gaussian_window(centres, side, side, sigma)  # (4, 49)
        torch.testing.assert_close(w.sum(-1), torch.ones(4, dtype=torch.float64))
        peak = torch.stack([w.argmax(-1) // side, w.argmax(-1) % side], 1)
        assert torch.equal(peak, centres.round().long()), sigma
        # symmetric: cells at the same distance from the centre weigh the same
        sym = gaussian_window(torch.tensor([[3.0, 3.0]]), side, side, sigma).view(side, side)
        torch.testing.assert_close(sym, sym.T)
        torch.testing.assert_close(sym, sym.flip(0))
    # local alpha is the global alpha times the window, renormalised, and differentiable in the centre
    centre = torch.tensor([[2.0, 5.0]], dtype=torch.float64, requires_grad=True)
    e = torch.randn(1, side * side, dtype=torch.float64)
    local = torch.softmax(e + window_log(centre, side, side, 1.5), -1)
    product = torch.softmax(e, -1) * gaussian_window(centre, side, side, 1.5)
    torch.testing.assert_close(local, product / product.sum())
    (local * torch.arange(side * side)).sum().backward()
    assert centre.grad.abs().sum() > 0


def test_local_decoder_looks_near_its_predicted_centre():
    dec = make_decoder(window="local", local_sigma=0.5).eval()
    features, captions, lengths = make_batch()
    out = dec(features, captions, lengths)
    # with a narrow window, each step's weight sits mostly within one cell of some centre
    a = out.alphas[out.mask]  # (N, L)
    peak = a.argmax(-1)
    cells = torch.stack([torch.arange(L) // GRID, torch.arange(L) % GRID], 1)
    near = ((cells.unsqueeze(0) - cells[peak].unsqueeze(1)).abs().max(-1).values <= 1).double()
    assert ((a * near).sum(-1) > 0.8).all()


def test_doubly_stochastic_penalty_per_head():
    g = torch.Generator().manual_seed(0)
    alphas = torch.softmax(torch.randn(2, 5, 3, L, generator=g), -1)  # (B, T, heads, L)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    per_head = torch.stack([doubly_stochastic_penalty(alphas[:, :, k], mask) for k in range(3)], 1)
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, mask), per_head.mean(1))
    dec = make_decoder(dtype=torch.float32, heads=2)
    features, captions, lengths = make_batch(dtype=torch.float32)
    loss = CrossEntropy(doubly_stochastic=1.0)(dec, features, {"captions": captions, "lengths": lengths})
    out = dec(features, captions, lengths)
    torch.testing.assert_close(
        loss.logs["attention_penalty"], doubly_stochastic_penalty(out.head_alphas, out.mask).mean()
    )


# ---------------------------------------------------------------------- search
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("num_beams", [1, 3])
def test_batched_search_equals_per_image_search(variant, num_beams):
    dec = make_decoder(dtype=torch.float32, **VARIANTS[variant]).eval()
    features = torch.randn(5, L, D, generator=torch.Generator().manual_seed(4))
    config = GenerationConfig(num_beams=num_beams, max_new_tokens=8)
    search = greedy_search if num_beams == 1 else beam_search
    batched = search(dec, features, config)
    for i in range(features.size(0)):
        one = search(dec, features[i : i + 1], config)
        n = int(one.lengths[0])
        assert int(batched.lengths[i]) == n
        assert torch.equal(batched.sequences[i, :n], one.sequences[0, :n])
        torch.testing.assert_close(batched.scores[i], one.scores[0], **float32_tolerance(one.scores, TINY_PATH))
        torch.testing.assert_close(batched.alphas[i, :n], one.alphas[0, :n], **float32_tolerance(1.0, TINY_PATH))
        if dec.heads > 1:
            maps = float32_tolerance(1.0, TINY_PATH)
            torch.testing.assert_close(batched.head_alphas[i, :n], one.head_alphas[0, :n], **maps)
            torch.testing.assert_close(batched.head_alphas[i, :n].mean(1), batched.alphas[i, :n])


@pytest.mark.parametrize("variant", ["luong", "multihead", "local", "refiner"])
def test_search_scores_are_the_teacher_forced_log_likelihood(variant):
    """The step used in decoding and the fast teacher-forced pass are the same model, and decoding
    keeps the model's float64 throughout: the scores and maps are float64 and equal the teacher-forced
    pass's to float64 precision (a float32 step or score would be off by ~1e-7, and of another dtype)."""
    dec = make_decoder(**VARIANTS[variant]).eval()
    features = torch.randn(3, L, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for search in (beam_search, greedy_search):
        out = search(
            dec,
            features,
            GenerationConfig(num_beams=2 if search is beam_search else 1, max_new_tokens=6, length_penalty=0.0),
        )
        assert out.scores.dtype == out.alphas.dtype == torch.float64
        captions = torch.cat([torch.ones(3, 1, dtype=torch.long), out.sequences], 1)
        ll, _, tf = fast(dec, features, captions, out.lengths + 1)
        torch.testing.assert_close(ll, out.scores, rtol=1e-12, atol=1e-12)
        n = int(out.lengths.min())
        torch.testing.assert_close(tf.alphas[:, :n], out.alphas[:, :n], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------- configs and checkpoints
def test_bad_variant_settings_are_one_line_errors():
    from captioning.errors import ConfigError

    for bad, words in (
        (dict(score="cosine"), "model.decoder.score"),
        (dict(heads=0), "model.decoder.heads"),
        (dict(placement="after"), "model.decoder.placement"),
        (dict(window="near"), "model.decoder.window"),
        (dict(local_sigma=0), "local_sigma"),
        (dict(refiner_layers=-1), "refiner_layers"),
    ):
        with pytest.raises(ConfigError, match=words):
            DecoderConfig(**bad)
    with pytest.raises(ConfigError, match="heads"):
        ShowAttendTellDecoder(V, D, DecoderConfig(attention_dim=8, heads=3))
    with pytest.raises(ConfigError, match="dot"):
        ShowAttendTellDecoder(V, D, DecoderConfig(hidden_dim=D + 1, score="dot"))


def test_a_checkpoint_from_before_the_variants_loads_as_the_papers_model(tiny_checkpoint, tmp_path):
    from captioning.storage.load import load_model

    ckpt = torch.load(tiny_checkpoint, weights_only=True)
    new_fields = ("score", "heads", "placement", "window", "local_sigma", "refiner_layers", "refiner_heads", "kind")
    assert all(f in ckpt["hyper_parameters"]["decoder"] for f in new_fields)
    for f in new_fields:  # the decoder entry as checkpoints written before these fields hold it
        del ckpt["hyper_parameters"]["decoder"][f]
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    model = load_model(old)
    assert model.decoder.config == DecoderConfig(**{**ckpt["hyper_parameters"]["decoder"]})
    assert model.decoder.config.variant == "additive" and model.decoder.heads == 1
    for (k, a), b in zip(load_model(tiny_checkpoint).state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("group", [1, 3])
def test_luong_pass_is_the_same_whatever_the_grouping(group, monkeypatch):
    dec = make_decoder(**VARIANTS["luong_local_heads"]).eval()
    features, captions, lengths = make_batch()
    ll, alphas, _ = fast(dec, features, captions, lengths)
    grads = torch.autograd.grad(ll.sum(), list(dec.parameters()))
    monkeypatch.setattr(unroll, "LUONG_GROUP", group)
    ll2, alphas2, _ = fast(dec, features, captions, lengths)
    torch.testing.assert_close(ll2, ll)
    torch.testing.assert_close(alphas2, alphas)
    for a, b in zip(torch.autograd.grad(ll2.sum(), list(dec.parameters())), grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_api_gives_each_heads_maps_and_renders_them_as_panels(kind, tmp_path):
    import numpy as np
    from PIL import Image

    from captioning.api import Captioner
    from captioning.models.encoders import EncoderConfig
    from captioning.models.show_attend_tell import ShowAttendTell
    from captioning.vocab import Vocabulary

    torch.manual_seed(0)
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(V - 4)])
    model = ShowAttendTell(
        EncoderConfig(name="small_cnn", pretrained=False, channels=(4,), dim=D),
        DecoderConfig(embed_dim=6, hidden_dim=D, attention_dim=8, dropout=0.0, heads=2, attention_kind=kind),
        vocab,
    )
    with torch.no_grad():
        model.decoder.out_logits.bias[Vocabulary.eos_id] = -50.0  # a caption of max_new_tokens words
    captioner = Captioner(model, image_size=32, device="cpu")
    image = Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8))
    [out] = captioner(
        image, return_attention=True, max_new_tokens=4, attention_mode="argmax" if kind == "hard" else "expected"
    )
    T = len(out["tokens"])
    assert out["head_attention"].shape[:2] == (T, 2)
    np.testing.assert_allclose(out["head_attention"].mean(1), out["attention"], rtol=1e-5, atol=1e-7)
    if kind == "hard":
        assert len(out["head_locations"]) == T and all(len(step) == 2 for step in out["head_locations"])
    mean_frames = captioner.render(image, out, format="gif")
    each_frames = captioner.render(image, out, format="gif", heads="each")
    assert len(each_frames) == len(mean_frames) and each_frames[0].width > 2 * mean_frames[0].width - 1
    grid = captioner.render(image, out, format="png", heads="each")
    assert grid.height > 2 * captioner.render(image, out, format="png").height - 1
    path = captioner.render(image, out, tmp_path / "heads.gif", heads="each")
    assert Image.open(path).n_frames == len(each_frames)
    with pytest.raises(ValueError, match="heads"):
        captioner.render(image, out, format="png", heads="some")


def test_print_config_shows_the_variant_settings(capsys, tiny_shapes):
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import ROOT

    for config, expected in (
        (
            "shapes_soft.yaml",
            ("score: additive", "heads: 1", "placement: bahdanau", "window: global", "refiner_layers: 0"),
        ),
        ("shapes_luong.yaml", ("placement: luong",)),
        ("shapes_local.yaml", ("window: local", "local_sigma: 1.5")),
        ("shapes_multihead.yaml", ("heads: 4",)),
        ("shapes_refiner.yaml", ("refiner_layers: 1",)),
    ):
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli(
                [
                    "fit",
                    "--config",
                    str(ROOT / "configs" / config),
                    "--data.annotations",
                    str(tiny_shapes),
                    "--print_config",
                ]
            )
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        for line in expected:
            assert f"    {line}\n" in out, (config, line)


def test_evaluate_scores_grounding_per_head(tiny_shapes, tmp_path):
    from captioning.cli.evaluate import evaluate
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, config="shapes_multihead.yaml", steps=2))
    report = evaluate(
        cli.model,
        str(tiny_shapes),
        split="test",
        generation=GenerationConfig(num_beams=2, max_new_tokens=12),
        device="cpu",
        grounding=True,
        progress=False,
    )
    grounding = report["scores"]["grounding"]
    per_head = grounding["per_head"]
    assert len(per_head) == 4  # shapes_multihead.yaml: 4 heads
    for head in per_head:  # the same words are scored, each head's maps instead of their mean
        assert head["count"] == grounding["count"]
        if head["count"]:  # (a model two steps old may name no object at all)
            assert 0.0 <= head["attention_correctness"] <= 1.0 and 0.0 <= head["pointing_game"] <= 1.0


def test_evaluator_gives_the_dataset_scores_each_heads_maps():
    import numpy as np

    from captioning.decoding.evaluator import Evaluator

    evaluator = Evaluator(keep_alignments=True)
    heads = np.random.default_rng(0).random((2, 3, L))  # (T, heads, L)
    evaluator.alignments = {7: (["a", "b"], heads.mean(1), None)}
    evaluator.head_alphas = {7: heads}
    seen = []

    def dataset_scores(predictions, alignments):
        seen.append(alignments[7][1])
        return {"grounding": {"count": 1, "first": float(alignments[7][1][0, 0])}}

    evaluator._scorer = lambda refs, preds: {}  # no coco-caption metrics here
    scores, _ = evaluator.score({7: "a b"}, {7: ["a b"]}, dataset_scores)
    np.testing.assert_array_equal(seen[0], heads.mean(1))
    for k in range(3):
        np.testing.assert_array_equal(seen[1 + k], heads[:, k])
    assert [h["first"] for h in scores["grounding"]["per_head"]] == [heads[0, k, 0] for k in range(3)]
