"""Hard attention's estimator options (objectives/reinforce.py), Gumbel straight-through (attention.py),
best-of-K decoding (search.py) and the hard shapes preset (data/shapes/__init__.py)."""

import hashlib
import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.data import shapes
from captioning.data.formats.karpathy import load_karpathy
from captioning.decoding.search import GenerationConfig, generate
from captioning.errors import ConfigError
from captioning.models.decoder import glimpse
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.objectives.gumbel import HardAttentionGumbel
from captioning.objectives.reinforce import (
    HardAttentionReinforce,
    leave_one_out_baseline,
    location_grad_sq,
    reinforce_loss,
)
from captioning.training.cli import run_lightning_cli
from captioning.training.loading import load_module
from tests.helpers import exact_gradient, fit_args, flat_grad, z_scores


# --------------------------------------------------------------------------- unbiased baselines
def _estimates(dec, features, captions, lengths, baseline_of, k=4, batches=30, rows=400):
    """Batch means of the REINFORCE estimator with ``baseline_of(reward (rows,)) -> (rows,)``."""
    out_list = []
    for _ in range(batches):
        out = dec(features.expand(rows, -1, -1), captions.expand(rows, -1), lengths.expand(rows), mode="sample")
        ll = caption_log_likelihood(out.logits, captions.expand(rows, -1)[:, 1:], out.mask)
        terms = reinforce_loss(
            ll,
            out.location_log_probs,
            out.entropies,
            out.mask,
            baseline_of(ll.detach()),
            lambda_r=1.0,
            lambda_e=0.0,
            reward_per_step=False,
        )
        out_list.append(flat_grad(ll.mean() - terms.loss, list(dec.parameters())))
    return torch.stack(out_list)


def _directions(exact):
    return torch.cat([exact.unsqueeze(0) / exact.norm(), torch.randn(3, exact.numel())])


def test_leave_one_out_baseline_keeps_the_estimator_unbiased(tiny_problem):
    torch.manual_seed(1)
    dec, features, captions, lengths = tiny_problem()
    exact = exact_gradient(dec, features, captions, lengths)
    directions = _directions(exact)
    k = 4  # rows are 100 captions x 4 samples each, the samples of a caption consecutive
    torch.manual_seed(2)
    z = z_scores(
        _estimates(dec, features, captions, lengths, lambda r: leave_one_out_baseline(r, k)), exact, directions
    )
    assert z.abs().max() < 4.0, z
    # The check can fail: a baseline that includes the sample's own reward is biased, and it sees that.
    torch.manual_seed(2)
    own = _estimates(
        dec,
        features,
        captions,
        lengths,
        lambda r: r.view(-1, 2).mean(1, keepdim=True).expand(-1, 2).reshape(-1),
        batches=80,
    )
    assert z_scores(own, exact, directions).abs().max() > 6.0


def test_learned_baseline_keeps_the_estimator_unbiased_and_learns_the_reward(tiny_problem):
    torch.manual_seed(1)
    dec, features, captions, lengths = tiny_problem()
    exact = exact_gradient(dec, features, captions, lengths)
    objective = HardAttentionReinforce(baseline="learned")
    # a baseline that depends on the image (here: on its annotation vectors through w), not on s
    objective.baseline_weight = torch.full((features.size(2),), 0.3)
    objective.baseline.fill_(-1.5)

    def learned(reward):
        b, _ = objective.baselines(reward, features.expand(reward.numel(), -1, -1))
        return b

    torch.manual_seed(2)
    z = z_scores(_estimates(dec, features, captions, lengths, learned), exact, _directions(exact))
    assert z.abs().max() < 4.0, z
    # commit() fits b(a) to the rewards: two kinds of images with different rewards, the error falls
    objective = HardAttentionReinforce(baseline="learned", baseline_decay=0.99, baseline_lr=0.5)
    feats = torch.cat([torch.ones(8, 3, 5), -torch.ones(8, 3, 5)])
    reward = torch.cat([torch.full((8,), -1.0), torch.full((8,), -3.0)])
    errors = []
    for _ in range(200):
        b, state = objective.baselines(reward, feats)
        logs = objective.commit(type("Out", (), {"state": {**state, "reward": reward}})())
        errors.append(float(logs["baseline_mse"]))
    assert errors[-1] < 0.01 * errors[0]
    # with row weights (semi_sampling_per: expectation) a row of weight 0 does not move the fit, and the step
    # equals the unweighted step on the rows that count
    fits = []
    feats, reward = torch.randn(16, 3, 5), torch.randn(16)
    feats[1::2] = 10.0 + feats[1::2]
    reward[1::2] = 50.0  # the weight-0 rows: far from the others, they would pull the fit
    for rows, weight in ((slice(None), torch.tensor([2.0, 0.0] * 8)), (slice(0, None, 2), None)):
        objective = HardAttentionReinforce(baseline="learned", baseline_lr=0.5)
        b, state = objective.baselines(reward[rows], feats[rows])
        extra = {} if weight is None else {"weight": weight}
        objective.commit(type("Out", (), {"state": {**state, "reward": reward[rows], **extra}})())
        fits.append(torch.cat([objective.baseline_weight, objective.baseline_bias.view(1)]))
    torch.testing.assert_close(fits[0], fits[1])


def _semi_sampling_estimates(problem, per, p, batches=30, captions_per_batch=200):
    """Batch means of the objective's ascent direction (-loss) with the expected-context probability p."""
    dec, features, captions, lengths = problem
    objective = HardAttentionReinforce(
        doubly_stochastic=0.0,
        lambda_r=1.0,
        lambda_e=0.0,
        reward_per_step=False,
        semi_sampling_p=p,
        semi_sampling_p_final=None,
        semi_sampling_per=per,
    )
    objective.baseline.fill_(-2.0)
    batch = {"captions": captions.expand(captions_per_batch, -1), "lengths": lengths.expand(captions_per_batch)}
    feats = features.expand(captions_per_batch, -1, -1)
    return torch.stack([flat_grad(-objective(dec, feats, batch).loss, list(dec.parameters())) for _ in range(batches)])


def test_expectation_over_the_semi_sampling_draw_keeps_the_estimator_unbiased(tiny_problem):
    """semi_sampling_per "expectation" decodes each caption with the expected context and with sampled
    locations, weighted p and 1 - p: the same mean as the per-image draw, p g_expected + (1 - p) g_exact."""
    problem = tiny_problem()
    dec, features, captions, lengths = problem
    exact = exact_gradient(dec, features, captions, lengths)
    out = dec(features, captions, lengths, mode="expected")
    g_expected = flat_grad(caption_log_likelihood(out.logits, captions[:, 1:], out.mask).sum(), list(dec.parameters()))
    p = 0.2
    target = p * g_expected + (1 - p) * exact
    torch.manual_seed(1)
    gap = g_expected - exact
    directions = torch.cat(
        [target.unsqueeze(0) / target.norm(), gap.unsqueeze(0) / gap.norm(), torch.randn(2, exact.numel())]
    )
    for per in ("expectation", "image"):
        torch.manual_seed(3)
        z = z_scores(_semi_sampling_estimates(problem, per, p), target, directions)
        assert z.abs().max() < 4.0, (per, z)
    # The check can fail: weights of another p (here the rows weighted 0.6 / 0.4) move the mean, and it sees that.
    torch.manual_seed(3)
    assert z_scores(_semi_sampling_estimates(problem, "expectation", 0.6), target, directions).abs().max() > 6.0
    # every caption takes both rows: exactly half the rows the expected context, each caption's pair adjacent
    objective = HardAttentionReinforce(semi_sampling_per="expectation", semi_sampling_p=0.2)
    out = objective(dec, features.expand(3, -1, -1), {"captions": captions.expand(3, -1), "lengths": lengths.expand(3)})
    assert out.batch_size == 6 and out.logs["expected_fraction"].item() == 0.5
    assert torch.allclose(out.state["weight"], torch.tensor([0.4, 1.6] * 3))
    with pytest.raises(ConfigError, match="num_samples"):
        HardAttentionReinforce(semi_sampling_per="expectation", num_samples=2)


def test_location_grad_sq_is_the_squared_gradient_of_the_location_term():
    torch.manual_seed(0)
    B, T, L = 3, 4, 5
    scores = torch.randn(B, T, L, requires_grad=True)
    alphas = scores.softmax(-1)
    locations = torch.multinomial(alphas.detach().view(-1, L), 1).view(B, T)
    log_p = torch.log(alphas).gather(2, locations.unsqueeze(2)).squeeze(2)
    log_p = log_p.masked_fill(torch.tensor([[False] * T, [False] * T, [True] * T]), 0.0)  # row 2: expected context
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    advantage = torch.tensor([0.5, -2.0, 1.0])
    per_row = []
    for b in range(B):  # autograd, one caption at a time
        (g,) = torch.autograd.grad(0.1 * advantage[b] * (log_p[b] * mask[b]).sum(), scores, retain_graph=True)
        per_row.append(g.pow(2).sum())
    expected = torch.stack(per_row).mean()
    got = location_grad_sq(advantage, alphas.detach(), locations, log_p.detach(), mask, 0.1)
    assert torch.allclose(got, expected, rtol=1e-5), (got, expected)


# --------------------------------------------------------------------------- Gumbel straight-through
def test_gumbel_straight_through_reads_one_location_and_has_finite_gradients():
    torch.manual_seed(0)
    B, L, D = 6, 9, 4
    scores = torch.randn(B, L, requires_grad=True)
    features = torch.randn(B, L, D, requires_grad=True)
    g = glimpse(scores.softmax(-1), features, mode="gumbel", temperature=0.5)
    # forward: exactly the annotation vector of one location per row (a one-hot weighting)
    assert torch.allclose(g.context, features[torch.arange(B), g.location], atol=1e-6)
    (g.context * torch.randn(B, D)).sum().backward()
    assert torch.isfinite(scores.grad).all() and scores.grad.abs().sum() > 0  # the relaxed path reaches alpha
    # the locations are distributed as alpha (the Gumbel-max trick)
    alpha = torch.tensor([[0.6, 0.3, 0.1]])
    counts = torch.zeros(3)
    for _ in range(40):
        g = glimpse(alpha.expand(500, -1), torch.randn(1, 3, 2).expand(500, -1, -1), mode="gumbel", temperature=2.0)
        counts += torch.bincount(g.location, minlength=3)
    assert torch.allclose(counts / counts.sum(), alpha[0], atol=0.01), counts / counts.sum()
    # rows marked for the expected context take it
    g = glimpse(alpha.expand(2, -1), torch.randn(2, 3, 2), mode="gumbel", use_expected=torch.tensor([True, False]))
    assert g.log_prob[0] == 0 and g.log_prob[1] < 0


def test_gumbel_decoder_pass_gives_finite_gradients(tiny_problem):
    torch.manual_seed(0)
    dec, features, captions, lengths = tiny_problem()
    out = dec(features.expand(4, -1, -1), captions.expand(4, -1), lengths.expand(4), mode="gumbel", temperature=0.3)
    ll = caption_log_likelihood(out.logits, captions.expand(4, -1)[:, 1:], out.mask)
    grads = torch.autograd.grad(ll.sum(), list(dec.f_att.parameters()))
    assert all(torch.isfinite(g).all() for g in grads) and sum(g.abs().sum() for g in grads) > 0


# --------------------------------------------------------------------------- options from the config
OPTIONS = {
    "leave_one_out": [
        "--model.objective.init_args.num_samples",
        "3",
        "--model.objective.init_args.baseline",
        "leave_one_out",
    ],
    "learned": ["--model.objective.init_args.baseline", "learned"],
    "normalize": ["--model.objective.init_args.normalize_reward", "true"],
    "label_smoothing": ["--model.objective.init_args.label_smoothing", "0.2"],
    "per_image": [
        "--model.objective.init_args.semi_sampling_per",
        "image",
        "--model.objective.init_args.num_samples",
        "2",
    ],
    "entropy_schedule": [
        "--model.objective.init_args.lambda_e",
        "0.05",
        "--model.objective.init_args.lambda_e_final",
        "0.0",
        "--model.objective.init_args.entropy_anneal_steps",
        "2",
    ],
    "p_schedule": [
        "--model.objective.init_args.semi_sampling_per",
        "image",
        "--model.objective.init_args.semi_sampling_p",
        "1.0",
        "--model.objective.init_args.semi_sampling_p_final",
        "0.25",
        "--model.objective.init_args.semi_sampling_anneal_steps",
        "2",
    ],
    "expectation": [
        "--model.objective.init_args.semi_sampling_per",
        "expectation",
        "--model.objective.init_args.semi_sampling_p",
        "0.5",
        "--model.objective.init_args.semi_sampling_p_final",
        "null",
    ],
    # the Gumbel objective by its earlier spelling (HardAttentionReinforce, estimator gumbel) and by its class
    "gumbel": [
        "--model.objective.init_args.estimator",
        "gumbel",
        "--model.objective.init_args.gumbel_temperature",
        "1.0",
        "--model.objective.init_args.gumbel_temperature_final",
        "0.5",
        "--model.objective.init_args.gumbel_anneal_steps",
        "2",
    ],
    "gumbel_class": [
        "--model.objective",
        "HardAttentionGumbel",
        "--model.objective.init_args.gumbel_temperature",
        "1.0",
        "--model.objective.init_args.gumbel_temperature_final",
        "0.5",
        "--model.objective.init_args.gumbel_anneal_steps",
        "2",
    ],
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_estimator_option_fits_steps_from_its_config(option, tiny_shapes, tmp_path):
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, config="shapes_hard.yaml", steps=2, extra=OPTIONS[option]))
    assert cli.trainer.global_step == 2
    objective = cli.model.objective
    assert int(objective.steps_done) == 2
    assert objective.baseline.item() < 0  # it tracked the (negative) log-likelihood rewards
    if option == "learned":
        assert objective.baseline_weight.numel() == 256 and objective.baseline_weight.abs().sum() > 0
    if option.startswith("gumbel"):
        assert isinstance(objective, HardAttentionGumbel) and objective.current_temperature() == pytest.approx(0.5)
    else:
        assert isinstance(objective, HardAttentionReinforce)
    if option == "p_schedule":
        assert objective.current_semi_sampling_p() == pytest.approx(0.25)
    assert objective.label_smoothing == (0.2 if option == "label_smoothing" else 0.1)  # the config's 0.1
    # the checkpoint rebuilds the objective with its settings and running state
    module = load_module(Path(cli.trainer.checkpoint_callback.last_model_path))
    assert type(module.objective) is type(objective) and module.objective.settings == objective.settings
    buffers = dict(objective.named_buffers())
    assert dict(module.objective.named_buffers()).keys() == buffers.keys()
    for name, value in module.objective.named_buffers():
        assert torch.equal(value, buffers[name].cpu()), name


def test_bad_estimator_options_are_config_errors():
    with pytest.raises(ConfigError, match="leave_one_out needs num_samples >= 2"):
        HardAttentionReinforce(baseline="leave_one_out")
    with pytest.raises(ConfigError, match="estimator"):
        HardAttentionReinforce(estimator="straight")
    with pytest.raises(ConfigError, match="gumbel_temperature"):
        HardAttentionGumbel(gumbel_temperature=0.0)
    with pytest.raises(ConfigError, match="gumbel_anneal_steps"):
        HardAttentionGumbel(gumbel_temperature_final=0.5, gumbel_anneal_steps=-1)
    with pytest.raises(ConfigError, match="estimator: gumbel is the objective HardAttentionGumbel"):
        HardAttentionReinforce(estimator="gumbel")
    with pytest.raises(ConfigError, match="semi_sampling_p_final: expected a probability"):
        HardAttentionReinforce(semi_sampling_p_final=1.5)
    with pytest.raises(ConfigError, match="semi_sampling_anneal_steps"):
        HardAttentionReinforce(semi_sampling_p_final=0.5, semi_sampling_anneal_steps=-1)


def test_semi_sampling_schedule_moves_captions_from_the_expected_context_to_samples(tiny_problem):
    """p = 1 -> 0 over 4 steps: every caption takes the expected context at the start (no location
    term, no sampled log-probabilities), half of them midway, none at the end; per-batch and per-image."""
    dec, features, captions, lengths = tiny_problem()
    rows = 400
    batch = {"captions": captions.expand(rows, -1), "lengths": lengths.expand(rows)}
    feats = features.expand(rows, -1, -1)
    for per in ("image", "batch"):
        objective = HardAttentionReinforce(
            semi_sampling_p=1.0, semi_sampling_p_final=0.0, semi_sampling_anneal_steps=4, semi_sampling_per=per
        )
        fractions = []
        for step in range(6):
            torch.manual_seed(step)
            out = objective(dec, feats, batch)
            fractions.append(out.logs["expected_fraction"].item())
            if step == 0:
                assert out.logs["location_grad_sq"].item() == 0.0  # no caption sampled a location
            assert out.logs["semi_sampling_p"].item() == pytest.approx(max(1.0 - step / 4, 0.0))
            objective.commit(out)
        assert fractions[0] == 1.0 and fractions[4] == 0.0 and fractions[5] == 0.0
        if per == "image":  # p = 0.5 at step 2: about half the captions of one batch
            assert 0.4 < fractions[2] < 0.6
        assert objective.current_semi_sampling_p() == 0.0


# --------------------------------------------------------------------------- best-of-K decoding
def test_best_of_k_keeps_the_best_scoring_of_k_sampled_decodings(make_decoder):
    dec = make_decoder(
        dtype=torch.float32, vocab_size=11, feature_dim=6, embed_dim=8, hidden_dim=12, attention_kind="hard"
    )
    features = torch.randn(3, 5, 6)
    K = 4
    config = GenerationConfig(max_new_tokens=6, location_samples=K)
    torch.manual_seed(7)  # the location samples come from the global generator: the same draws twice
    best = generate(dec, features, config)
    torch.manual_seed(7)
    every = generate(dec, features.repeat_interleave(K, 0), config.replace(attention_mode="sample", location_samples=1))
    scores = every.scores.view(3, K)
    assert len(set(scores.flatten().tolist())) > 3  # the K decodings differ
    pick = torch.arange(3) * K + scores.argmax(1)
    assert torch.equal(best.scores, scores.max(1).values)
    assert torch.equal(best.sequences, every.sequences[pick]) and torch.equal(best.locations, every.locations[pick])
    # with K large the best of K is at least as good as a single sampled decoding, on average
    single = torch.stack(
        [generate(dec, features, config.replace(location_samples=1, attention_mode="sample")).scores for _ in range(8)]
    ).mean(0)
    many = generate(dec, features, config.replace(location_samples=16)).scores
    assert (many >= single - 1e-6).all()
    with pytest.raises(ConfigError, match="location_samples"):
        GenerationConfig(location_samples=0)


# --------------------------------------------------------------------------- the hard preset
def test_default_dataset_is_unchanged(tmp_path):
    # the demo's data must stay byte-identical: the digest of a small default set, recorded
    # with the generator before the presets were added
    path = shapes.generate(tmp_path, n_train=6, n_val=2, n_test=2, seed=0, progress=False)
    digest = hashlib.sha256(path.read_bytes())
    for p in sorted((tmp_path / "images").rglob("*.png")):
        digest.update(p.read_bytes())
    assert digest.hexdigest() == DEFAULT_DIGEST


DEFAULT_DIGEST = "f577a261dba5921b8a9bb028033c22883138f6cadf00ad5eb372403c51ea9f00"


def test_hard_preset_generates_valid_data_with_grounding_boxes(tmp_path):
    path = shapes.generate(tmp_path, n_train=30, n_val=5, n_test=5, seed=1, preset="hard", progress=False)
    data = json.loads(path.read_text())
    seen = {"size": set(), "color": set(), "shape": set()}
    for im in data["images"]:
        assert im["filename"].endswith(".jpg")
        from PIL import Image

        with Image.open(tmp_path / im["filepath"] / im["filename"]) as img:
            assert img.format == "JPEG" and img.size == (64, 64)
        objects = im["objects"]
        assert 2 <= len(objects) <= 4
        for o in objects:
            x0, y0, x1, y1 = o["bbox"]
            assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
            for k in seen:
                seen[k].add(o[k])
        for a, b in combinations([o["bbox"] for o in objects], 2):
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
        # the canonical caption names every object, and the parser reads the new words
        assert sorted(shapes.parse_objects(im["sentences"][0]["raw"])) == sorted(
            map(tuple, (o["words"] for o in objects))
        )
        assert all(len(s["tokens"]) <= 30 for s in im["sentences"])
    assert (
        seen["size"] - set(shapes.SIZES) and seen["color"] - set(shapes.COLOURS) and seen["shape"] - set(shapes.SHAPES)
    )
    # grounding scores the boxes: a map on each named object's cell points inside, one on a far cell does not
    records = [r for r in load_karpathy(path) if r.split == "test"]
    records = {r.image_id: r for r in records}
    hits, misses = {}, {}
    for image_id, rec in records.items():
        words = shapes._captions(np.random.default_rng(0), rec.objects, 64)[0].split()
        G, cell = 16, 4  # a 16 x 16 grid of 4-pixel cells (the smallest objects are 8 pixels wide)
        inside = np.zeros((len(words), G * G))
        outside = np.zeros((len(words), G * G))
        for t, (size, colour, shape) in shapes.locate_objects(words):
            obj = next(o for o in rec.objects if tuple(o["words"]) == (size, colour, shape))
            cx, cy = (obj["bbox"][0] + obj["bbox"][2]) / 2, (obj["bbox"][1] + obj["bbox"][3]) / 2
            inside[t, int(cy // cell) * G + int(cx // cell)] = 1.0
            far = max(range(G * G), key=lambda c: (c % G * cell + 2 - cx) ** 2 + (c // G * cell + 2 - cy) ** 2)
            outside[t, far] = 1.0
        hits[image_id] = (words, inside, None)
        misses[image_id] = (words, outside, None)
    assert shapes.grounding(records, hits)["pointing_game"] == 1.0
    assert shapes.grounding(records, misses)["pointing_game"] < 0.2


def test_make_shapes_preset_option(tmp_path):
    import subprocess
    import sys

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "captioning.cli",
            "make-shapes",
            "--out",
            str(tmp_path),
            "--train",
            "3",
            "--val",
            "1",
            "--test",
            "1",
            "--preset",
            "hard",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert len(list((tmp_path / "images").rglob("*.jpg"))) == 5
    run = subprocess.run(
        [sys.executable, "-m", "captioning.cli", "make-shapes", "--out", str(tmp_path), "--preset", "huge"],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "huge" in run.stderr


def test_checkpoint_of_an_older_objective_loads_with_start_values():
    # checkpoints written before the options existed hold only the moving-average baseline
    objective = HardAttentionReinforce()
    objective.load_state_dict({"baseline": torch.tensor(-0.7)})
    assert objective.baseline.item() == pytest.approx(-0.7)
    assert objective.advantage_var.item() == 1.0 and int(objective.steps_done) == 0
    assert objective.baseline_weight.numel() == 0
    # a learned baseline's weights come back with their size
    learned = HardAttentionReinforce(baseline="learned")
    learned.load_state_dict({**objective.state_dict(), "baseline_weight": torch.arange(3.0)})
    assert torch.equal(learned.baseline_weight, torch.arange(3.0))
