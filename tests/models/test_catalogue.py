"""The course notes' catalogue of attention mechanisms (models/attention/: uniform, concat, normalized,
scaled, sparsemax, local_p, hierarchical, pooling, over_attention): each mechanism's batched code
equals its formula written out in float64, values and gradients; the properties the papers state;
the one-line errors; and every option through training, the searches, ensembles, the pictures, the
web API, checkpoints and model folders. (Each variant's whole decoder against the oracle:
tests/models/test_decoder.py; the fast twin: tests/fast/.)"""

import math
from pathlib import Path

import pytest
import torch

from captioning.decoding.search import GenerationConfig, beam_search, generate, greedy_search
from captioning.errors import ConfigError
from captioning.fast import fast_decoder
from captioning.models.attention.concat import ConcatScore
from captioning.models.attention.hierarchical import regions
from captioning.models.attention.local_p import LocalMWindow, LocalPWindow
from captioning.models.attention.normalized import NormalizedScore
from captioning.models.attention.over_attention import OverAttentionDecoder, OverAttentionState
from captioning.models.attention.pooling import AttentionPool
from captioning.models.attention.scaled import ScaledScore
from captioning.models.attention.sparsemax import sparsemax
from captioning.models.attention.uniform import UniformScore
from captioning.models.decoder import NORMALIZERS, AdditiveScore, DecoderConfig, DecoderState
from captioning.objectives.cross_entropy import caption_log_likelihood
from tests import oracle
from tests.helpers import GRID, VARIANTS, D, V, fit_args

L = GRID * GRID
EPS64 = torch.finfo(torch.float64).eps
SOFTMAX = NORMALIZERS.get("softmax")

#: each option of the catalogue, as a decoder's settings (tests/helpers.py: VARIANTS has more combinations)
CATALOGUE = {
    name: VARIANTS[name]
    for name in (
        "uniform",
        "concat",
        "normalized",
        "scaled",
        "sparsemax",
        "local_p",
        "local_m",
        "hierarchical",
        "attention_pool",
        "over_attention",
    )
}


def values_and_gradients(fn, inputs: list, seed: int = 0):
    """fn() and the gradient of a random weighting of it with respect to ``inputs``."""
    out = fn()
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return out, torch.autograd.grad((out * weights).sum(), inputs)


def assert_same_function(mine, theirs, inputs):
    """Two computations agree in float64: values and every input's gradient."""
    a, grads_a = values_and_gradients(mine, inputs)
    b, grads_b = values_and_gradients(theirs, inputs)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    for x, y in zip(grads_a, grads_b):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def randn(*shape, seed=0, grad=True):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x.requires_grad_(grad)


# ---------------------------------------------------------------------- scores
def test_uniform_scores_give_one_over_L_and_the_same_context_at_every_step(make_decoder, make_batch):
    score = UniformScore(D, D, 8, heads=2)
    features = randn(3, L, D)
    e = score(score.project(features), randn(6, D), beams=2)
    assert e.shape == (6, 2, L) and not e.any()
    for normalizer in ("softmax", "sparsemax"):
        dec = make_decoder(score="uniform", normalizer=normalizer)
        features, captions, lengths = make_batch()
        out = dec(features, captions, lengths)
        assert (out.alphas[out.mask] == 1.0 / L).all()
        # the context before the gate is mean_i a_i at every step, whatever the words: z_t = beta_t mean_i a_i
        for decoder in (dec, fast_decoder(dec)):
            state = decoder.initial_state(features)
            tokens = torch.full((4,), 1)
            for t in range(5):
                g, beta, z = dec.attend(state.h, state, "expected")
                torch.testing.assert_close(g.context, features.mean(1), rtol=4 * EPS64, atol=1e-15)
                torch.testing.assert_close(z, beta.unsqueeze(1) * features.mean(1), rtol=4 * EPS64, atol=1e-15)
                _, state, g = decoder.step(tokens, state)
                torch.testing.assert_close(g.context, features.mean(1), rtol=4 * EPS64, atol=1e-15)
                tokens = torch.full((4,), 4 + t)


@pytest.mark.parametrize("heads", [1, 2])
def test_the_concat_score_is_its_formula(heads):
    score = ConcatScore(D, 7, 8, heads).double()
    features, h = randn(3, L, D, seed=1), randn(6, 7, seed=2)  # 3 images x 2 beams

    def formula():  # e_kti = v_a,k^T tanh(W_a [h; a_i] + b)[k's rows]
        rows = []
        for n in range(6):
            e = [[0.0] * L for _ in range(heads)]
            for i in range(L):
                y = torch.tanh(score.W_a.weight @ torch.cat([h[n], features[n // 2, i]]) + score.W_a.bias)
                for k in range(heads):
                    e[k][i] = y[k * 8 // heads : (k + 1) * 8 // heads] @ score.v_a[k]
            rows.append(torch.stack([torch.stack(row) for row in e]))
        return torch.stack(rows).squeeze(1)

    assert_same_function(
        lambda: score(score.project(features), h, beams=2), formula, [features, h, *score.parameters()]
    )


@pytest.mark.parametrize("kind,heads", [("additive", 1), ("concat", 1), ("additive", 2), ("concat", 2)])
def test_the_normalised_score_is_g_v_over_its_norm(kind, heads):
    inner = (AdditiveScore if kind == "additive" else ConcatScore)(D, 7, 8, heads).double()
    score = NormalizedScore(inner).double()
    assert score.g.item() == pytest.approx(math.sqrt(1 / (8 // heads)))  # TF's initial g: sqrt(1 / A)
    v = inner.w if kind == "additive" else inner.v_a
    features, h = randn(3, L, D, seed=1), randn(6, 7, seed=2)

    def formula():  # e_kti = g v_k^T / ||v_k|| tanh(y_ti)[k's part], y from the score's own projections
        y = torch.tanh(score.project(features).unsqueeze(1) + score.query(h).view(3, 2, 1, 8))  # (3, 2, L, A)
        parts = y.view(3, 2, L, heads, 8 // heads)
        e = torch.stack([score.g * parts[..., k, :] @ (v[k] / torch.sqrt((v[k] ** 2).sum())) for k in range(heads)], 2)
        return e.reshape(6, heads, L).squeeze(1)

    assert_same_function(
        lambda: score(score.project(features), h, beams=2), formula, [features, h, *score.parameters()]
    )
    before = score(score.project(features), h, beams=2)
    with torch.no_grad():
        v.mul_(3.7)  # only v's direction counts
    torch.testing.assert_close(score(score.project(features), h, beams=2), before, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind,heads", [("dot", 1), ("general", 1), ("general", 2)])
def test_the_scaled_score_is_a_learned_multiple(kind, heads, make_decoder):
    dec = make_decoder(score=kind, scale=True, heads=heads)
    score = dec.f_att
    assert isinstance(score, ScaledScore) and score.g.item() == 1.0  # the unscaled score at the start
    features, h = randn(3, L, D, seed=1), randn(6, D, seed=2)
    unscaled = score.score(score.project(features), h, beams=2)
    torch.testing.assert_close(score(score.project(features), h, beams=2), unscaled, rtol=0, atol=0)
    with torch.no_grad():
        score.g.fill_(2.5)

    def formula():  # e = g h^T a_i (dot) or g h^T W_a a_i (general), each head on its part
        keys = features if kind == "dot" else features @ score.score.W_a.weight.T
        d = D // heads
        e = [[score.g * keys[n // 2, :, k * d : (k + 1) * d] @ h[n, k * d : (k + 1) * d] for k in range(heads)]
             for n in range(6)]  # fmt: skip
        return torch.stack([torch.stack(row) for row in e]).squeeze(1)

    assert_same_function(
        lambda: score(score.project(features), h, beams=2), formula, [features, h, *score.parameters()]
    )


# ---------------------------------------------------------------------- sparsemax
def test_sparsemax_is_a_probability_vector_with_exact_zeros_and_the_published_form():
    torch.testing.assert_close(
        sparsemax(torch.tensor([1.0, 0.5, -1.0], dtype=torch.float64)),  # k(z) = 2, tau = (1.5 - 1) / 2
        torch.tensor([0.75, 0.25, 0.0], dtype=torch.float64),
    )
    z = 3 * randn(40, 4, L, grad=False)  # (N, heads, L); and (N, L) below
    for scores in (z, z[:, 0]):
        p = sparsemax(scores)
        assert p.shape == scores.shape and (p >= 0).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1], dtype=p.dtype), rtol=0, atol=L * EPS64)
        zeros = (p == 0).sum(-1)
        assert zeros.min() >= 1 and zeros.float().mean() > L / 3  # exact zeros, in every row
        flat = scores.reshape(-1, L)
        torch.testing.assert_close(p.reshape(-1, L), torch.stack([oracle.sparsemax(row) for row in flat]))
        torch.testing.assert_close(sparsemax(scores + 5.0), p)  # a shift changes nothing
        # (values in the support minus tau): the projection onto the simplex, the closest point to z
        assert (
            torch.cdist(p.reshape(-1, 1, L), flat.unsqueeze(1))
            .squeeze()
            .le(torch.cdist(torch.softmax(flat, -1).unsqueeze(1), flat.unsqueeze(1)).squeeze() + 1e-12)
            .all()
        )
    assert torch.equal(sparsemax(torch.zeros(2, L)), torch.full((2, L), 1.0 / L))
    assert torch.equal(sparsemax(torch.tensor([[0.0, 5.0, 1.0]])), torch.tensor([[0.0, 1.0, 0.0]]))
    with_outside = torch.tensor([[0.3, float("-inf"), 0.2, float("-inf")]])
    assert sparsemax(with_outside)[0, [1, 3]].eq(0).all()
    assert sparsemax(torch.randn(3, 5)).dtype == torch.float32
    assert NORMALIZERS.get("sparsemax") is sparsemax


def test_sparsemax_gradient_is_the_closed_form():
    """On the support S, dL/dz = g - mean_S(g); 0 off it (Martins and Astudillo 2016, Eq. 14)."""
    z = 3 * randn(50, L, seed=4, grad=False)
    z.requires_grad_(True)
    g = randn(50, L, seed=5, grad=False)
    p = sparsemax(z)
    (grad,) = torch.autograd.grad((p * g).sum(), z)
    support = (p > 0).to(z.dtype)
    mean_on_support = (g * support).sum(-1, keepdim=True) / support.sum(-1, keepdim=True)
    torch.testing.assert_close(grad, support * (g - mean_on_support), rtol=1e-12, atol=1e-14)
    (row_grad,) = torch.autograd.grad((oracle.sparsemax(z[0]) * g[0]).sum(), z)  # the transcription's, too
    torch.testing.assert_close(grad[0], row_grad[0], rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------- Luong's local attention
def luong_state(side: int, t=None) -> DecoderState:
    features = randn(2, side * side, D, grad=False)
    return DecoderState(None, None, features, None, beams=3, t=t)


def test_local_p_weights_are_zero_outside_the_window_and_unnormalised_inside():
    side, width = 7, 2
    window = LocalPWindow(D, 8, DecoderConfig(window="local_p", local_width=width)).double()
    with torch.no_grad():
        window.v_p.weight.mul_(8.0)  # centres spread over the grid
    h, e = randn(6, D, seed=1), randn(6, side * side, seed=2)
    state = luong_state(side)
    alpha, shown = window(e, h, state, SOFTMAX)
    centre = shown[:, :2]
    assert torch.equal(shown[:, 2], torch.full((6,), float(width), dtype=torch.float64))
    cells = torch.tensor([(r, c) for r in range(side) for c in range(side)], dtype=torch.float64)
    inside = ((cells.unsqueeze(0) - centre.unsqueeze(1)).abs() <= width).all(-1)  # (6, L)
    assert inside.sum(1).min() >= 9 and (~inside).sum(1).min() > 0  # the centres reach the edges and the middle
    assert (alpha[~inside] == 0).all()
    gaussian = torch.exp(-((cells.unsqueeze(0) - centre.unsqueeze(1)) ** 2).sum(-1) / (2 * (width / 2) ** 2))
    align = torch.where(inside, alpha / gaussian, 0.0)
    torch.testing.assert_close(align.sum(1), torch.ones(6, dtype=torch.float64))  # the softmax over the window
    assert (alpha.sum(1) < 0.999).all()  # the Gaussian multiplied in, not renormalised

    def formula():  # per row: softmax over the window's cells times exp(-|cell - p_t|^2 / (2 (D/2)^2))
        p = (side - 1) * torch.sigmoid(torch.tanh(h @ window.W_p.weight.T) @ window.v_p.weight.T)  # p_t
        rows = []
        for n in range(6):
            mask = ((cells - p[n]).abs() <= width).all(-1)
            soft = torch.zeros(side * side, dtype=torch.float64).masked_scatter(mask, torch.softmax(e[n][mask], 0))
            rows.append(soft * torch.exp(-((cells - p[n]) ** 2).sum(-1) / (2 * (width / 2) ** 2)))
        return torch.stack(rows)

    assert_same_function(lambda: window(e, h, state, SOFTMAX)[0], formula, [h, e, *window.parameters()])


def test_local_m_centres_walk_the_grid_in_raster_order(make_decoder):
    window = LocalMWindow(D, 8, DecoderConfig(window="local_m", local_width=1))
    t = torch.tensor([0, 1, 7, 48, 49, 50])
    _, shown = window(torch.zeros(6, 49), torch.zeros(6, D), luong_state(7, t), SOFTMAX)
    assert shown[:, :2].tolist() == [[0, 0], [0, 1], [1, 0], [6, 6], [0, 0], [0, 1]]
    # through the searches: step t's window is centred on cell t mod L, on every beam
    dec = make_decoder(window="local_m", local_width=1, eos=-50.0)  # captions of max_new_tokens words
    features = torch.randn(2, L, D, dtype=torch.float64)
    for config in (GenerationConfig(max_new_tokens=11), GenerationConfig(max_new_tokens=11, num_beams=3)):
        for decoder in (dec, fast_decoder(dec)):
            out = generate(decoder, features, config)
            cell = torch.arange(11) % L
            want = torch.stack([cell // GRID, cell % GRID], 1).to(torch.float64).expand(2, 11, 2)
            assert torch.equal(out.views["window"][..., :2], want)
            assert (out.alphas.sum(-1) < 1).all()


@pytest.mark.parametrize("window", ["local_p", "local_m"])
def test_the_local_windows_refuse_a_grid_they_cannot_be_local_on(window, make_decoder):
    for side, width, words in ((1, 1, "1x1"), (3, 2, "5x5 cells (D = 2) is wider than the 3x3 grid"),
                               (2, 1, "wider than the 2x2 grid")):  # fmt: skip
        dec = make_decoder(window=window, local_width=width)
        features = torch.randn(2, side * side, D, dtype=torch.float64)
        with pytest.raises(ConfigError) as err:
            dec(features, torch.tensor([[1, 5, 2], [1, 2, 0]]), torch.tensor([3, 2]))
        assert words in str(err.value) and "\n" not in str(err.value), side


# ---------------------------------------------------------------------- hierarchical attention
def test_regions_tile_the_grid_with_narrower_regions_at_the_far_edges():
    member = regions(7, 7, 2)
    assert member.shape == (16, 49) and torch.equal(member.sum(0), torch.ones(49, dtype=torch.long))
    assert member.sum(1).tolist() == [4, 4, 4, 2] * 3 + [2, 2, 2, 1]
    first = member[0].view(7, 7).nonzero().tolist()
    assert first == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert regions(3, 3, 2).sum(1).tolist() == [4, 2, 2, 1]
    assert regions(4, 4, 1).shape == (16, 16)


def test_the_hierarchical_window_is_its_formula(make_decoder):
    dec = make_decoder(window="hierarchical", region_size=2, heads=2)
    window = dec.window
    with torch.no_grad():
        window.v_s.mul_(4.0)
    features, h, e = randn(3, L, D, seed=1), randn(6, D, seed=2), randn(6, 2, L, seed=3)  # 3 images x 2 beams
    state = DecoderState(h, h, features, None, beams=2)

    def formula():
        return torch.stack([oracle.hierarchical(dec, features[n // 2], e[n], h[n]) for n in range(6)])

    inputs = [features, h, e, *window.parameters()]
    assert_same_function(lambda: window(e, h, state, SOFTMAX)[0], formula, inputs)
    alpha, beta = window(e, h, state, SOFTMAX)
    # each region's weights add up to its beta (the heads' mean), and beta and alpha to one
    per_region = alpha @ regions(GRID, GRID, 2).to(alpha.dtype).T  # (6, heads, R)
    torch.testing.assert_close(per_region.mean(1), beta)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(6, 2, dtype=torch.float64))
    with pytest.raises(ConfigError, match=r"region_size: regions of 3x3 cells make one region of the 3x3 grid"):
        make_decoder(window="hierarchical", region_size=3).window(e, h, state, SOFTMAX)


def test_a_focus_prior_reaches_the_hierarchical_windows_regions(make_decoder):
    """The prior b is in e (the decoder adds it) and its share log mean_{i in r} exp(b_i) in each
    region's score: the formula in float64; a box over region 0 divides every other region's
    weight, relative to region 0's, by exp(S), as a flat softmax does each cell outside the box."""
    dec = make_decoder(window="hierarchical", region_size=2, heads=2)
    features, h, e = randn(3, L, D, seed=1), randn(6, D, seed=2), randn(6, 2, L, seed=3)  # 3 images x 2 beams
    bias = randn(3, L, seed=4, grad=False)
    state = DecoderState(h, h, features, None, beams=2, bias=bias)
    biased = e + bias.repeat_interleave(2, 0).unsqueeze(1)

    def formula():
        return torch.stack(
            [oracle.hierarchical(dec, features[n // 2], biased[n], h[n], bias[n // 2]) for n in range(6)]
        )

    assert_same_function(lambda: dec.window(biased, h, state, SOFTMAX)[0], formula, [features, h, e])
    dec = make_decoder(window="hierarchical", region_size=2)
    e, S = e[:, 0].detach(), 5.0
    box = regions(GRID, GRID, 2)[0]  # the cells of region 0
    prior = (S * (box.to(torch.float64) - 1)).expand(3, L)
    with torch.no_grad():
        _, plain = dec.window(e, h, DecoderState(h, h, features, None, beams=2), SOFTMAX)
        _, steered = dec.window(e + prior[0], h, DecoderState(h, h, features, None, beams=2, bias=prior), SOFTMAX)
    torch.testing.assert_close(
        steered / steered[:, :1], plain / plain[:, :1] * torch.tensor([1.0, *[math.exp(-S)] * 3])
    )


# ---------------------------------------------------------------------- attention pooling
def test_attention_pooling_is_its_formula_and_makes_the_initial_state(make_decoder):
    pool = AttentionPool(D, 8).double()
    features = randn(3, L, D, seed=1)

    def formula():  # u_i = tanh(W a_i + b), alpha = softmax(u_i^T u_w), s = sum_i alpha_i a_i
        rows = []
        for a in features:
            u = torch.stack([torch.tanh(pool.W.weight @ a_i + pool.W.bias) @ pool.u_w for a_i in a])
            rows.append((torch.exp(u) / torch.exp(u).sum()) @ a)
        return torch.stack(rows)

    assert_same_function(lambda: pool(features), formula, [features, *pool.parameters()])
    dec = make_decoder(init="attention_pool")
    state = dec.initial_state(features)
    h0, c0 = torch.tanh(dec.W_init(dec.pool(features))).chunk(2, -1)
    torch.testing.assert_close(state.h, h0, rtol=0, atol=0)
    torch.testing.assert_close(state.c, c0, rtol=0, atol=0)
    assert not torch.allclose(h0, torch.tanh(dec.W_init(features.mean(1))).chunk(2, -1)[0])


# ---------------------------------------------------------------------- attention over attention
def test_over_attentions_matching_matrix_is_keys_times_states_and_its_first_step_plain_attention(make_decoder):
    dec = make_decoder(over_attention=True, score="general")
    features = randn(2, L, D, seed=1, grad=False)
    state = dec.initial_state(features, max_steps=4).expand_beams(3)
    assert isinstance(state, OverAttentionState) and state.scores.shape == (6, 5, L)
    states = [state.h]  # h_0, h_1, h_2
    for _ in range(2):
        state = dec.step(torch.full((6,), 5), state)[1]
        states.append(state.h)
    M = dec.matching(state)  # (N, S, L): scores h_2 into slot 2, keeps the rows of h_0 and h_1
    keys = features @ dec.f_att.W_a.weight.T  # K = W_a a_i
    expected = torch.einsum("nsh,nlh->nsl", torch.stack(states, 1), keys.repeat_interleave(3, 0))
    torch.testing.assert_close(M[:, :3], expected)
    assert (M[:, 3:] == 0).all()  # slots not reached yet
    torch.testing.assert_close(state.matched, M, rtol=0, atol=0)  # the next state's rows
    with pytest.raises(RuntimeError, match="did not attend"):
        dec.initial_state(features).with_recurrent(state.h[:2], state.c[:2])
    # at the first step there is one state: beta_bar = 1 and alpha is the plain attention of h_0
    plain = make_decoder(score="general")
    plain.load_state_dict(dec.state_dict())
    first = dec.initial_state(features)
    g, _, _ = dec.attend(first.h, first, "expected")
    g_plain, _, _ = plain.attend(first.h, plain.initial_state(features), "expected")
    torch.testing.assert_close(g.alpha, g_plain.alpha, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("variant", ["over_attention", "over_attention_general_sparsemax", "local_m", "hierarchical"])
def test_the_searches_carry_the_state_the_teacher_forced_pass_has(variant, make_decoder):
    """Greedy and beam search give the teacher-forced pass's log-likelihood and maps in float64 (the
    history of states, written in its fixed-length slots and reordered with the beams, and the steps
    taken), and greedy search the oracle's words."""
    dec = make_decoder(sharpen=3.0, eos=1.0, **VARIANTS[variant])
    features = randn(3, L, D, seed=5, grad=False)
    for search, beams in ((greedy_search, 1), (beam_search, 3)):
        config = GenerationConfig(num_beams=beams, max_new_tokens=7, length_penalty=0.0)
        out = search(fast_decoder(dec), features, config)
        captions = torch.cat([torch.ones(3, 1, dtype=torch.long), out.sequences], 1)
        tf = dec(features, captions, out.lengths + 1)
        torch.testing.assert_close(caption_log_likelihood(tf.logits, captions[:, 1:], tf.mask), out.scores,
                                   rtol=1e-12, atol=1e-12)  # fmt: skip
        n = int(out.lengths.min())
        torch.testing.assert_close(tf.alphas[:, :n], out.alphas[:, :n], rtol=1e-12, atol=1e-12)
    out = greedy_search(dec, features, GenerationConfig(max_new_tokens=7))
    for b in range(3):
        words = oracle.greedy(dec, features[b], 7)
        assert out.sequences[b, : len(words)].tolist() == words


def test_over_attention_runs_plain_and_says_so(make_decoder, caplog):
    dec = make_decoder(over_attention=True)
    with caplog.at_level("WARNING", logger="captioning.fast"):
        assert fast_decoder(dec) is dec
    assert "OverAttentionDecoder runs as written (no fast path for OverAttentionDecoder)" in caplog.text
    assert isinstance(dec, OverAttentionDecoder)


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "settings,words",
    [
        (dict(normalizer="entmax"), "model.decoder.normalizer: unknown normaliser 'entmax'; expected one of softmax"),
        (dict(normalize=True, score="dot"), "model.decoder.normalize: an option of the additive and concat scores"),
        (dict(scale=True, score="additive"), "model.decoder.scale: an option of the dot and general scores"),
        (dict(init="max"), "model.decoder.init: expected 'mean' or 'attention_pool'"),
        (dict(over_attention=True, placement="luong"), "model.decoder.over_attention"),
        (dict(window="local_q"), "model.decoder.window: unknown attention window 'local_q'"),
        (dict(score="luong_concat"), "model.decoder.score: unknown attention score 'luong_concat'"),
    ],
)
def test_bad_catalogue_settings_are_one_line_errors(settings, words):
    with pytest.raises(ConfigError) as err:
        DecoderConfig(**settings)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


def test_options_of_another_kind_or_that_do_not_combine_are_one_line_errors():
    from captioning.models.kinds import decoder_config

    with pytest.raises(ConfigError) as err:
        decoder_config({"kind": "transformer", "over_attention": True})
    assert "over_attention: an option of decoder kind 'lstm'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        DecoderConfig(over_attention=True, window="local_p").build(V, D)
    assert str(err.value).startswith("model.decoder.over_attention: attends over the whole grid; window 'local_p'")


def test_onnx_export_refuses_each_option_in_one_line(tmp_path):
    from captioning.export.onnx import export_onnx, lstm_unsupported

    assert lstm_unsupported(DecoderConfig()) == ""
    for name, settings in CATALOGUE.items():
        unsupported = lstm_unsupported(DecoderConfig(**settings))
        assert unsupported and all(
            f"{k}={v!r}" in unsupported for k, v in settings.items() if k not in ("local_width", "region_size")
        ), name
    model = tiny_model(score="concat", normalize=True, normalizer="sparsemax")
    with pytest.raises(ConfigError) as err:
        export_onnx(model, tmp_path / "onnx")
    message = str(err.value)
    assert "\n" not in message and "score='concat', normalizer='sparsemax', normalize=True" in message
    assert not (tmp_path / "onnx").exists()


# ---------------------------------------------------------------------- every option end to end
@pytest.mark.slow  # training until learned: 10 to 50 s an option on a busy 2-core machine
@pytest.mark.parametrize("name", list(CATALOGUE))
def test_every_option_learns(name, make_decoder, make_batch):
    """A few dozen steps of the twin the commands train (the plain decoder where it has none) fit four
    captions: the loss falls to under 40% of its start."""
    dec = make_decoder(dtype=torch.float32, **CATALOGUE[name])
    features, captions, lengths = make_batch(dtype=torch.float32)
    twin = fast_decoder(dec)
    optimizer = torch.optim.Adam(dec.parameters(), lr=0.03)
    losses = []
    for _ in range(30):
        out = twin(features, captions, lengths)
        loss = -caption_log_likelihood(out.logits, captions[:, 1:], out.mask).sum() / out.mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.4 * losses[0], losses


def tiny_model(seed: int = 0, **decoder):
    """An untrained ShowAttendTell on 32-pixel images (an 8x8 grid), sharpened so that captions vary."""
    from captioning.models.encoders import EncoderConfig
    from captioning.models.spec import ModelSpec, build_model
    from captioning.vocab import Vocabulary

    torch.manual_seed(seed)
    spec = ModelSpec(
        EncoderConfig(channels=(4, 8), dim=8, pretrained=False),
        DecoderConfig(8, 16, 8, dropout=0.0, **decoder),
        image_size=32,
        generation=GenerationConfig(num_beams=2, max_new_tokens=6),
    )
    words = ["a", "red", "blue", "circle", "square", "left", "of"]
    model = build_model(spec, Vocabulary.build([words], min_freq=1)).eval()
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.mul_(3.0)
    return model


def test_every_option_in_ensembles_pictures_the_api_and_model_folders(tmp_path):
    import numpy as np
    from PIL import Image

    from captioning.api import Captioner
    from captioning.decoding.ensemble import Ensemble
    from captioning.storage.folder import save_folder
    from captioning.storage.load import load_model

    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    image = Image.fromarray((images[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    paper = tiny_model(seed=1)
    for name, settings in CATALOGUE.items():
        model = tiny_model(**settings)
        for beams in (1, 2):
            config = GenerationConfig(num_beams=beams, max_new_tokens=6)
            alone = model.generate(images=images, config=config)
            both = Ensemble([model, paper]).generate(images=images, config=config)
            assert both.sequences.shape[0] == 3 and both.head_alphas.shape[2] == 2, name
            twice = Ensemble([model, model]).generate(images=images, config=config)  # one model, twice: itself
            assert torch.equal(twice.sequences, alone.sequences), name
        # a model folder gives back the same model
        folder = save_folder(tmp_path / name, model)
        loaded = load_model(folder)
        assert loaded.decoder.config == model.decoder.config, name
        for (key, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
            assert torch.equal(a, b), (name, key)
        # the API's maps and its pictures
        [out] = Captioner(loaded, image_size=32, device="cpu")(image, return_attention=True, max_new_tokens=5)
        T = len(out["tokens"])
        assert out["attention"].shape[0] == T and np.isfinite(out["attention"]).all(), name
        assert Captioner(loaded, image_size=32, device="cpu").render(image, out, format="png").width > 0


@pytest.fixture(scope="module")
def catalogue_checkpoints(tiny_shapes, tmp_path_factory):
    """Two training steps of the shapes recipe with every option of the catalogue (four runs that
    combine them): the options and their checkpoints."""
    from captioning.training.cli import run_lightning_cli

    runs = {
        "concat_normalized_sparsemax_hierarchical_pool": dict(
            score="concat", normalize=True, normalizer="sparsemax", window="hierarchical", init="attention_pool"
        ),
        "general_scaled_local_p_luong": dict(score="general", scale=True, window="local_p", placement="luong"),
        "uniform_local_m": dict(score="uniform", window="local_m", local_width=3),
        "over_attention_general": dict(over_attention=True, score="general"),
    }
    out = {}
    for name, settings in runs.items():
        root = tmp_path_factory.mktemp(name)
        extra = [x for k, v in settings.items() for x in (f"--model.decoder.{k}", str(v).lower())]
        cli = run_lightning_cli(fit_args(tiny_shapes, root, steps=2, extra=extra))
        out[name] = (settings, Path(cli.trainer.checkpoint_callback.last_model_path), cli.model.model)
    return out


def test_every_option_round_trips_through_checkpoints_and_model_folders(catalogue_checkpoints, tiny_shapes, tmp_path):
    from captioning.storage.folder import save_folder
    from captioning.storage.load import load_model
    from tests.helpers import shapes_test_images

    options = set()
    for name, (settings, checkpoint, trained) in catalogue_checkpoints.items():
        options |= {k for k in settings if k not in ("local_width", "placement")} | {settings.get("score")}
        from_checkpoint = load_model(checkpoint)
        from_folder = load_model(save_folder(tmp_path / name, from_checkpoint))
        for model in (from_checkpoint, from_folder):
            config = model.decoder.config
            assert all(getattr(config, k) == v for k, v in settings.items()), name
            assert model.state_dict().keys() == trained.state_dict().keys()
        for (key, a), b in zip(from_checkpoint.state_dict().items(), from_folder.state_dict().values()):
            assert torch.equal(a, b), (name, key)
        from captioning.api import Captioner

        paths = shapes_test_images(tiny_shapes, 2)
        captions = [Captioner(m, device="cpu")(paths, max_new_tokens=6) for m in (from_checkpoint, from_folder)]
        assert [c["generated_text"] for c in captions[0]] == [c["generated_text"] for c in captions[1]], name
    covered = {"concat", "normalize", "normalizer", "window", "init", "general", "scale", "uniform", "over_attention"}
    assert covered <= options


@pytest.fixture
def serve_models(tmp_path):
    """``start(models)``: tests/web's server of ServedModel objects in a thread, stopped after the test."""
    pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
    pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
    pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")
    from tests.web.conftest import ThreadServer

    servers = []

    def start(models):
        servers.append(ThreadServer(models, workdir=str(tmp_path)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_the_web_api_serves_the_options_with_their_own_state(catalogue_checkpoints, tiny_shapes, serve_models):
    import numpy as np

    from captioning.api import Captioner
    from captioning.storage.load import load_model
    from captioning.web.client import caption
    from captioning.web.server import load_models
    from tests.helpers import shapes_test_images

    chosen = ["over_attention_general", "uniform_local_m"]
    server = serve_models(load_models([f"{n}={catalogue_checkpoints[n][1]}" for n in chosen]))
    [image] = shapes_test_images(tiny_shapes, 1)
    for name in chosen:
        out = caption(image, url=server.url, model=name, num_beams=2, max_new_tokens=6)
        [want] = Captioner(load_model(catalogue_checkpoints[name][1]), device="cpu")(
            [image], return_attention=True, num_beams=2, max_new_tokens=6
        )
        assert out["generated_text"] == want["generated_text"], name
        np.testing.assert_allclose(np.array(out["attention"]), want["attention"], atol=1e-4)
