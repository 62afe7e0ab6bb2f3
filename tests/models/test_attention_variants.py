"""The attention variants' own behaviour (models/attention/): hard sampling per head, one head is the
single-head model, the local window, the penalty per head, batched search equals per-image search,
the API's per-head maps, old checkpoints loading as the paper's model, print_config and grounding.
(Their equations against the oracle: tests/models/test_decoder.py; the fast path: tests/fast/.)"""

import math

import pytest
import torch

from captioning.decoding.search import GenerationConfig, beam_search, greedy_search
from captioning.models.attention.dot import ScaledDot
from captioning.models.attention.heads import MultiHead
from captioning.models.attention.local import LocalWindow
from captioning.models.decoder import AdditiveScore, DecoderConfig, glimpse
from captioning.objectives.cross_entropy import CrossEntropy, caption_log_likelihood, doubly_stochastic_penalty
from tests.helpers import GRID, TINY_PATH, VARIANTS, D, V, float32_tolerance

L = GRID * GRID


@pytest.mark.parametrize("variant", ["luong", "multihead", "local"])
def test_hard_sampling_with_forced_locations_equals_the_log_probabilities_per_head(variant, make_decoder, make_batch):
    dec = make_decoder(attention_kind="hard", **VARIANTS[variant])
    features, captions, lengths = make_batch()
    K = dec.config.heads
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
def test_one_head_equals_the_single_head_model(make_decoder):
    torch.manual_seed(0)
    projected_features = torch.randn(3, L, D, dtype=torch.float64)
    h = torch.randn(3 * 2, D, dtype=torch.float64)
    one, two = AdditiveScore(D, D, 8, 1).double(), AdditiveScore(D, D, 8, 2).double()
    two.load_state_dict({**one.state_dict(), "w": one.w.view(2, 4)})  # the same w, split between two heads
    e1, e2 = one(one.project(projected_features), h, beams=2), two(two.project(projected_features), h, beams=2)
    y = torch.tanh(one.project(projected_features).unsqueeze(1) + one.query(h).view(3, 2, 1, 8))  # (3, 2, L, 8)
    torch.testing.assert_close(e1, (y @ one.w[0]).view(6, L))  # Eq. 4
    torch.testing.assert_close(e2.sum(1), e1)  # each head scores with its half of w
    dot = ScaledDot(D, D, 8, heads=1).double()
    keys = dot.project(projected_features)
    torch.testing.assert_close(
        dot(keys, h, 2), (dot.query(h).view(3, 2, 8) @ keys.transpose(1, 2) / math.sqrt(8)).reshape(6, L)
    )
    # one head's glimpse, joined by an identity W_o, is the single-head glimpse, in every mode
    join = MultiHead(D, 1).double()
    with torch.no_grad():
        join.W_o.weight.copy_(torch.eye(D))
    alpha = torch.softmax(torch.randn(6, L, dtype=torch.float64), -1)
    for mode in ("expected", "argmax"):
        a, b = (
            join(alpha.unsqueeze(1), projected_features, mode, beams=2),
            glimpse(alpha, projected_features, mode, beams=2),
        )
        torch.testing.assert_close(a.context, b.context)
        torch.testing.assert_close(a.alpha, b.alpha)
    location = torch.randint(0, L, (6,))
    a = join(alpha.unsqueeze(1), projected_features, "sample", location=location.unsqueeze(1), beams=2)
    b = glimpse(alpha, projected_features, "sample", location=location, beams=2)
    torch.testing.assert_close(a.context, b.context)
    torch.testing.assert_close(a.log_prob, b.log_prob)
    # a one-head decoder is the default decoder, parameter for parameter (no projection, no new layers)
    assert make_decoder(heads=1).state_dict().keys() == make_decoder().state_dict().keys()


def test_multi_head_contexts_are_each_heads_expected_context_joined():
    torch.manual_seed(0)
    features = torch.randn(2, L, D, dtype=torch.float64)
    alpha = torch.softmax(torch.randn(2 * 3, 4, L, dtype=torch.float64), -1)  # 2 images x 3 beams, 4 heads
    join = MultiHead(D, 4).double()
    g = join(alpha, features, "expected", beams=3)
    by_hand = torch.einsum("nkl,nld->nkd", alpha, features.repeat_interleave(3, 0)).reshape(6, 4 * D)
    torch.testing.assert_close(g.context, by_hand @ join.W_o.weight.T)  # W_o [z_1; ...; z_4]
    torch.testing.assert_close(g.alpha, alpha.mean(1))


def test_local_window_peaks_at_the_predicted_centre_and_renormalises():
    side = 7
    window = LocalWindow(D, 8, DecoderConfig(local_sigma=1.5)).double()
    centres = torch.tensor([[0.0, 0.0], [3.2, 4.9], [6.0, 1.4], [2.5001, 2.4999]], dtype=torch.float64)
    for sigma in (0.5, 1.5, 4.0):
        window.sigma = sigma
        w = torch.softmax(window.log_window(centres, side, side), -1)  # (4, 49)
        peak = torch.stack([w.argmax(-1) // side, w.argmax(-1) % side], 1)
        assert torch.equal(peak, centres.round().long()), sigma
        sym = torch.softmax(window.log_window(torch.tensor([[3.0, 3.0]], dtype=torch.float64), side, side), -1).view(
            side, side
        )
        torch.testing.assert_close(sym, sym.T)  # cells at the same distance weigh the same
        torch.testing.assert_close(sym, sym.flip(0))
    # alpha is the global alpha times the window, renormalised, and differentiable in the centre
    window.sigma = 1.5
    centre = torch.tensor([[2.0, 5.0]], dtype=torch.float64, requires_grad=True)
    e = torch.randn(1, side * side, dtype=torch.float64)
    local = torch.softmax(e + window.log_window(centre, side, side), -1)
    product = torch.softmax(e, -1) * torch.exp(
        -((centre - torch.tensor([[r, c] for r in range(side) for c in range(side)], dtype=torch.float64)) ** 2).sum(-1)
        / (2 * 1.5**2)
    )
    torch.testing.assert_close(local, product / product.sum())
    (local * torch.arange(side * side)).sum().backward()
    assert centre.grad.abs().sum() > 0


def test_local_decoder_looks_near_its_predicted_centre(make_decoder, make_batch):
    dec = make_decoder(window="local", local_sigma=0.5)
    features, captions, lengths = make_batch()
    out = dec(features, captions, lengths)
    # with a narrow window, each step's weight sits mostly within one cell of some centre
    a = out.alphas[out.mask]  # (N, L)
    peak = a.argmax(-1)
    cells = torch.stack([torch.arange(L) // GRID, torch.arange(L) % GRID], 1)
    near = ((cells.unsqueeze(0) - cells[peak].unsqueeze(1)).abs().max(-1).values <= 1).double()
    assert ((a * near).sum(-1) > 0.8).all()


def test_doubly_stochastic_penalty_per_head(make_decoder, make_batch):
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
def test_batched_search_equals_per_image_search(variant, num_beams, make_decoder):
    dec = make_decoder(dtype=torch.float32, **VARIANTS[variant])
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
        if dec.config.heads > 1:
            maps = float32_tolerance(1.0, TINY_PATH)
            torch.testing.assert_close(batched.head_alphas[i, :n], one.head_alphas[0, :n], **maps)
            torch.testing.assert_close(batched.head_alphas[i, :n].mean(1), batched.alphas[i, :n])


@pytest.mark.parametrize("variant", ["luong", "multihead", "local", "refiner"])
def test_search_scores_are_the_teacher_forced_log_likelihood(variant, make_decoder):
    """The step used in decoding and the fast teacher-forced pass are the same model, and decoding
    keeps the model's float64 throughout: the scores and maps are float64 and equal the teacher-forced
    pass's to float64 precision (a float32 step or score would be off by ~1e-7, and of another dtype)."""
    dec = make_decoder(**VARIANTS[variant])
    features = torch.randn(3, L, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for search in (beam_search, greedy_search):
        out = search(
            dec,
            features,
            GenerationConfig(num_beams=2 if search is beam_search else 1, max_new_tokens=6, length_penalty=0.0),
        )
        assert out.scores.dtype == out.alphas.dtype == torch.float64
        captions = torch.cat([torch.ones(3, 1, dtype=torch.long), out.sequences], 1)
        tf = dec(features, captions, out.lengths + 1)
        ll = caption_log_likelihood(tf.logits, captions[:, 1:], tf.mask)
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
        DecoderConfig(attention_dim=8, heads=3).build(V, D)
    with pytest.raises(ConfigError, match="dot"):
        DecoderConfig(hidden_dim=D + 1, score="dot").build(V, D)


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
    assert model.decoder.config.variant == "additive" and model.decoder.multi_head is None
    for (k, a), b in zip(load_model(tiny_checkpoint).state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_api_gives_each_heads_maps_and_renders_them_as_panels(kind, tmp_path, tiny_model):
    import numpy as np
    from PIL import Image

    from captioning.api import Captioner
    from captioning.vocab import Vocabulary

    vocab = Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(V - 4)])
    model = tiny_model(kind, encoder={"channels": (4,), "dim": D}, vocab=vocab, embed_dim=6, hidden_dim=D, heads=2)
    with torch.no_grad():
        model.decoder.L_o.bias[Vocabulary.eos_id] = -50.0  # a caption of max_new_tokens words
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
    mean_frames = captioner.render(image, out)  # no format, no path: the frames
    each_frames = captioner.render(image, out, heads="each")
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


def test_evaluator_grounds_each_heads_maps():
    """The grounding metric scores the mean of the heads' maps, then each head's own."""
    import numpy as np

    from captioning.data.records import ImageRecord
    from captioning.evaluation.evaluator import Evaluator
    from captioning.metrics.grounding import grounding_scores

    record = ImageRecord(0, 7, "7.png", "test", ["a small red circle"], [["a", "small", "red", "circle"]])
    record.objects, record.width, record.height = (
        [{"words": ["small", "red", "circle"], "bbox": [0, 0, 16, 16]}],
        48,
        48,
    )

    class Data:  # the CaptionData the Evaluator reads the records of
        images_root = None

        def records(self, split):
            return [record]

    evaluator = Evaluator((), keep_alignments=True)
    heads = np.random.default_rng(0).random((4, 3, L))  # (T, heads, L)
    heads /= heads.sum(-1, keepdims=True)
    evaluator.alignments = {7: (["a", "small", "red", "circle"], heads.mean(1), None)}
    evaluator.head_alphas = {7: heads}
    scores, _ = evaluator.score({7: "a small red circle"}, {7: ["a small red circle"]}, Data(), "test")
    grounding = scores["grounding"]

    def expected(alphas):  # the shape noun "circle" is word 3
        return grounding_scores([(alphas[3].reshape(GRID, GRID), (48, 48), [0, 0, 16, 16])])

    assert grounding["count"] == 1
    assert grounding["attention_correctness"] == pytest.approx(expected(heads.mean(1))["attention_correctness"])
    assert [h["attention_correctness"] for h in grounding["per_head"]] == pytest.approx(
        [expected(heads[:, k])["attention_correctness"] for k in range(3)]
    )
    assert len({h["attention_correctness"] for h in grounding["per_head"]}) == 3  # the heads differ
