"""The static-shape training pass (the fast path's): every row at every step, padded to a length bucket,
masked in the losses, with nothing read back to the host, gives the same loss and gradients as the
shrinking-batch pass (float64), for soft and hard attention and the attention variants; and the
training module runs it (option static_shapes) with the same losses as today's pass."""

import pytest
import torch
import torch.nn.functional as F

from captioning.fast.lstm import FastLSTM
from captioning.models.decoder import DecoderConfig
from captioning.objectives.cross_entropy import CrossEntropy
from captioning.objectives.reinforce import HardAttentionReinforce
from tests.helpers import GRID

L = GRID * GRID

CASES = {
    "soft": dict(),
    "hard": dict(attention_kind="hard"),
    "dot_2heads": dict(score="dot", heads=2),
    "scaled_dot": dict(score="scaled_dot"),
    "local": dict(window="local", local_sigma=0.8),
    "luong": dict(placement="luong"),
    "luong_hard_heads": dict(placement="luong", heads=2, attention_kind="hard"),
    "refiner": dict(refiner_layers=1, refiner_heads=2),
}


def loss_and_grads(decoder, features, captions, lengths, static, **kwargs):
    """The fast path's pass (captioning/fast/: the shrinking batch, or the static pass): its loss,
    the features' gradient and the parameters'."""
    decoder.zero_grad()
    f = features.clone().requires_grad_(True)
    out = FastLSTM(decoder)(f, captions, lengths, static=static, **kwargs)
    loss, ll, _ = CrossEntropy().likelihood_terms(out, captions)
    if out.location_log_probs is not None:  # the REINFORCE-shaped terms of hard attention
        loss = loss - (out.location_log_probs * ll.detach().unsqueeze(1)).sum(1).mean() - 0.01 * out.entropies.sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in decoder.named_parameters() if p.grad is not None}
    return loss.detach(), f.grad.clone(), grads, out


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("pad_to", [None, 11])
def test_static_pass_equals_the_shrinking_batch_pass(case, pad_to, make_decoder, make_batch):
    decoder = make_decoder(**CASES[case])
    features, captions, lengths = make_batch(B=5)
    kwargs = {}
    if decoder.attention_kind == "hard":  # the same locations in both passes: given, and some rows expected
        g = torch.Generator().manual_seed(1)
        shape = (5, captions.size(1) - 1) + ((decoder.config.heads,) if decoder.config.heads > 1 else ())
        kwargs = dict(
            mode="sample",
            use_expected=torch.tensor([False, True, False, False, True]),
            locations=torch.randint(0, L, shape, generator=g),
        )
    ref_loss, ref_fgrad, ref_grads, ref = loss_and_grads(decoder, features, captions, lengths, False, **kwargs)
    if pad_to:  # the static pass reads captions padded to a longer bucket (and locations to match)
        captions = F.pad(captions, (0, pad_to - captions.size(1)))
        if "locations" in kwargs:
            extra = pad_to - 1 - kwargs["locations"].size(1)
            kwargs["locations"] = torch.cat([kwargs["locations"], kwargs["locations"][:, :extra]], 1)
    loss, fgrad, grads, out = loss_and_grads(decoder, features, captions, lengths, True, **kwargs)
    assert out.logits.dim() == 3 and out.logits.shape[:2] == captions[:, 1:].shape  # every step's logits
    torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fgrad, ref_fgrad, rtol=1e-9, atol=1e-12)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)
    T = ref.mask.size(1)
    torch.testing.assert_close(out.mask[:, :T], ref.mask)
    assert not out.mask[:, T:].any()
    for field in ("alphas", "betas", "locations", "location_log_probs", "entropies", "head_alphas"):
        a, b = getattr(out, field), getattr(ref, field)
        assert (a is None) == (b is None), field
        if a is not None:
            torch.testing.assert_close(a[:, :T], b, rtol=1e-10, atol=1e-12, msg=field)
            assert not a[:, T:].any(), field  # zero at padded steps


def test_hard_objective_reads_nothing_back_in_the_static_pass(make_decoder, make_batch):
    """The REINFORCE objective's loss and logs are the same with the static pass (given locations)."""
    twin = FastLSTM(make_decoder(attention_kind="hard"))
    features, captions, lengths = make_batch(B=5)
    batch = {"captions": captions, "lengths": lengths}
    results = []
    for static in (False, True):
        objective = HardAttentionReinforce(semi_sampling_per="image").double()
        torch.manual_seed(3)  # the same draws of use_expected; the locations are sampled: compare given ones below
        results.append(objective(twin, features, batch, static=static))
    assert set(results[0].logs) <= set(results[1].logs)
    # The sampled locations differ between the passes (different samplers), so compare what does
    # not depend on them: the use_expected draw and the logged fraction
    torch.testing.assert_close(results[0].logs["expected_fraction"], results[1].logs["expected_fraction"])
    assert torch.isfinite(results[1].loss)


# ---------------------------------------------------------------------- the training module
def fit_weights(tiny_shapes, root, config, extra):
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            root,
            config=config,
            steps=3,
            extra=[
                "--model.decoder.dropout",
                "0.0",
                "--trainer.enable_checkpointing",
                "false",
                "--trainer.gradient_clip_val",
                "0.05",
                # a constant rate (a schedule and model.cuda_graphs are refused together)
                "--model.optimizer.lr",
                "0.001",
                "--model.optimizer.schedule.kind",
                "none",
                *extra,
            ],
        )
    )
    return cli, {k: v.detach().clone() for k, v in cli.model.state_dict().items()}


@pytest.mark.parametrize("config", ["shapes_soft.yaml", "shapes_hard.yaml"])
def test_cuda_graphs_step_falls_back_on_cpu_and_equals_lightnings_step(tiny_shapes, tmp_path, config):
    """model.cuda_graphs on a CPU: the captured step's code runs without capture (manual
    optimisation: backward, clipping moved from the trainer, Adam) and leaves the same weights as
    Lightning's own loop on the static-shape pass; the default pass gives the same weights too
    (dropout off; hard attention: the same semi-sampling draws, locations drawn differently, so
    only the soft model is compared with it)."""
    static_cli, static = fit_weights(tiny_shapes, tmp_path / "static", config, ["--model.static_shapes", "true"])
    graphs_cli, graphs = fit_weights(tiny_shapes, tmp_path / "graphs", config, ["--model.cuda_graphs", "true"])
    assert static_cli.model.automatic_optimization and not graphs_cli.model.automatic_optimization
    assert graphs_cli.model.step_strategy.clip_val == 0.05 and graphs_cli.trainer.gradient_clip_val is None
    assert graphs_cli.trainer.global_step == static_cli.trainer.global_step == 3
    captured = graphs_cli.model.step_strategy.graphs
    assert captured is not None and not captured.captured  # ran, not captured
    # atol 1e-5: a parameter whose gradient is zero up to rounding (the score's bias, under a
    # softmax) moves by Adam's normalised rounding noise; a real difference moves weights by ~lr (1e-4)
    for k in static:
        torch.testing.assert_close(graphs[k], static[k], rtol=1e-5, atol=1e-5, msg=k)
    if config == "shapes_soft.yaml":
        _, default = fit_weights(tiny_shapes, tmp_path / "default", config, [])
        for k in default:
            torch.testing.assert_close(static[k], default[k], rtol=1e-4, atol=1e-5, msg=k)


def test_cuda_graphs_refuses_steps_it_cannot_capture():
    from captioning.errors import ConfigError
    from captioning.objectives import SCST
    from captioning.training.module import CaptioningModule

    with pytest.raises(ConfigError, match="cuda_graphs.*decodes"):
        CaptioningModule(objective=SCST(), cuda_graphs=True)
    with pytest.raises(ConfigError, match="cuda_graphs.*schedule"):
        CaptioningModule(
            decoder=DecoderConfig(attention_kind="hard"),
            cuda_graphs=True,
            objective=HardAttentionReinforce(lambda_e_final=0.0, entropy_anneal_steps=10),
        )
    # the semi-sampling schedule is computed on the device from the step count: it can be captured
    objective = HardAttentionReinforce(semi_sampling_p=1.0, semi_sampling_p_final=0.5, semi_sampling_anneal_steps=10)
    assert objective.static_step_problem() is None
    CaptioningModule(decoder=DecoderConfig(attention_kind="hard"), cuda_graphs=True, objective=objective)
    with pytest.raises(ConfigError, match="cuda_graphs.*skip"):
        CaptioningModule(cuda_graphs=True, nonfinite_loss="skip")
    with pytest.raises(ConfigError, match="length_buckets"):
        CaptioningModule(length_buckets=(1, 16))


def test_buckets_pad_captions():
    from captioning.training.module import CaptioningModule

    bucketed = CaptioningModule(static_shapes=True, length_buckets=(12, 8)).step_strategy.bucketed
    captions = torch.ones(2, 7, dtype=torch.long)
    assert bucketed(captions).shape == (2, 8) and not bucketed(captions)[:, 7:].any()
    assert bucketed(torch.ones(2, 12, dtype=torch.long)).shape == (2, 12)
    assert bucketed(torch.ones(2, 13, dtype=torch.long)).shape == (2, 13)  # longer: its own length


def test_nonfinite_loss_in_a_captured_step_stops_the_run(tiny_shapes, tmp_path):
    """The device-side check: a non-finite loss is found at the next read and stops with one line."""
    from captioning.errors import CaptioningError

    with pytest.raises(CaptioningError, match=r"non-finite loss in \d step\(s\) at or before global step"):
        fit_weights(
            tiny_shapes, tmp_path, "shapes_soft.yaml", ["--model.cuda_graphs", "true", "--model.optimizer.lr", "1e30"]
        )
