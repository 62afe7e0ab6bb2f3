"""The transformer decoder through training's options: static shapes, the weight average, the
warmup_rsqrt schedule, SCST; its checkpoint loads as a transformer and captions."""

from pathlib import Path

import pytest
import torch

from captioning.training.cli import run_lightning_cli
from tests.helpers import fit_args

TRANSFORMER = [
    "--model.decoder.kind",
    "transformer",
    "--model.decoder.embed_dim",
    "32",
    "--model.decoder.hidden_dim",
    "32",
    "--model.decoder.heads",
    "4",
    "--model.decoder.layers",
    "2",
]


@pytest.mark.parametrize(
    "config, extra",
    [
        (
            "shapes_transformer.yaml",
            [
                "--model.static_shapes",
                "true",
                "--model.optimizer.ema_start_step",
                "0",
                "--model.optimizer.schedule.kind",
                "warmup_rsqrt",
                "--model.optimizer.schedule.warmup_steps",
                "1",
                "--model.decoder.aoa",
                "true",
            ],
        ),
        ("scst_shapes_soft.yaml", TRANSFORMER),
    ],
)
def test_a_transformer_trains_and_its_checkpoint_captions(config, extra, tiny_shapes, tmp_path):
    from captioning.storage.load import load_model

    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, config=config, steps=2, extra=extra))
    assert cli.trainer.global_step == 2
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
    model = load_model(Path(cli.trainer.checkpoint_callback.last_model_path))
    assert model.spec.decoder.kind == "transformer" and type(model.decoder).__name__ == "TransformerDecoder"
    out = model.generate(torch.rand(2, 3, 64, 64), config=model.spec.generation.replace(max_new_tokens=5))
    assert out.sequences.shape[0] == 2 and out.alphas.shape[-1] == model.encoder(torch.rand(1, 3, 64, 64)).size(1)


# ------------------------------------------------------------------ static shapes and the captured step's code
def test_the_static_step_of_a_transformer_equals_the_eager_step():
    """StaticStep (fixed shapes, padded to a length bucket: what CUDA graphs capture) gives a
    transformer the eager step's loss and gradients (float64)."""
    from captioning.models.decoder import DecoderConfig
    from captioning.models.encoders import EncoderConfig
    from captioning.training.module import CaptioningModule
    from captioning.training.strategies import EagerStep, StaticStep
    from captioning.vocab import Vocabulary

    torch.manual_seed(0)
    vocab = Vocabulary.build([["a", "red", "circle", "on", "the", "left"]], min_freq=1)
    captions = torch.tensor([[1, 4, 5, 6, 2, 0, 0], [1, 7, 8, 9, 4, 5, 2], [1, 5, 2, 0, 0, 0, 0]])
    batch = {"images": torch.rand(3, 3, 16, 16).double(), "captions": captions, "lengths": torch.tensor([5, 7, 3])}
    results = []
    for static in (False, True):
        module = CaptioningModule(
            EncoderConfig(channels=(4, 8, 8), dim=8),
            DecoderConfig(kind="transformer", embed_dim=16, hidden_dim=16, heads=4, layers=2, dropout=0.0, aoa=True),
            image_size=16,
            static_shapes=static,
            length_buckets=(12,),
        )
        torch.manual_seed(1)
        module.set_vocab(vocab)
        module.model.double()
        assert isinstance(module.step_strategy, StaticStep if static else EagerStep)
        out = module.step_strategy(module, dict(batch), 0)
        out.loss.backward()
        grads = {k: p.grad.clone() for k, p in module.model.named_parameters() if p.grad is not None}
        results.append((out.loss.detach(), grads))
    (eager, eager_grads), (static, static_grads) = results
    torch.testing.assert_close(eager, static, rtol=1e-10, atol=1e-12)
    assert eager_grads.keys() == static_grads.keys() and len(eager_grads) > 10
    for k in eager_grads:
        torch.testing.assert_close(eager_grads[k], static_grads[k], rtol=1e-8, atol=1e-12, msg=k)


def fit_weights(tiny_shapes, root, extra):
    """3 steps of a tiny transformer (dropout off, a constant rate, clipping at 0.05): the CLI and
    its weights."""
    cli = run_lightning_cli(
        fit_args(
            tiny_shapes,
            root,
            config="shapes_transformer.yaml",
            steps=3,
            extra=[
                *TRANSFORMER,
                "--model.decoder.dropout",
                "0.0",
                "--trainer.enable_checkpointing",
                "false",
                "--trainer.gradient_clip_val",
                "0.05",
                "--model.optimizer.lr",
                "0.001",
                "--model.optimizer.schedule.kind",
                "none",
                *extra,
            ],
        )
    )
    return cli, {k: v.detach().clone() for k, v in cli.model.state_dict().items()}


@pytest.fixture(scope="module")
def static_fit(tiny_shapes, tmp_path_factory):
    return fit_weights(tiny_shapes, tmp_path_factory.mktemp("static"), ["--model.static_shapes", "true"])


def test_a_transformer_trains_with_static_shapes_as_with_the_default_step(static_fit, tiny_shapes, tmp_path):
    static_cli, static = static_fit
    _, default = fit_weights(tiny_shapes, tmp_path / "default", [])
    assert static_cli.trainer.global_step == 3 and type(static_cli.model.step_strategy).__name__ == "StaticStep"
    initial = fit_weights(tiny_shapes, tmp_path / "none", ["--trainer.max_steps", "0"])[1]
    moved = [k for k in static if static[k].is_floating_point() and not torch.equal(static[k], initial[k])]
    assert len(moved) > 20  # the steps trained
    for k in static:
        torch.testing.assert_close(default[k], static[k], rtol=1e-4, atol=1e-5, msg=k)


def test_the_captured_steps_code_runs_a_transformer_on_a_cpu(static_fit, tiny_shapes, tmp_path):
    """model.cuda_graphs on a CPU: the captured step's code (manual optimisation: backward,
    clipping moved from the trainer, Adam) runs without capture (capture itself needs a GPU)."""
    graphs_cli, graphs = fit_weights(tiny_shapes, tmp_path / "graphs", ["--model.cuda_graphs", "true"])
    assert not graphs_cli.model.automatic_optimization and graphs_cli.trainer.global_step == 3
    assert graphs_cli.model.step_strategy.clip_val == 0.05 and graphs_cli.trainer.gradient_clip_val is None
    captured = graphs_cli.model.step_strategy.graphs
    assert captured is not None and not captured.captured  # ran, not captured
    assert all(torch.isfinite(v).all() for v in graphs.values() if v.is_floating_point())


@pytest.mark.xfail(
    strict=True,
    reason="not found yet: from its second step the captured step's code leaves a transformer's weights "
    "up to 3.4e-4 from the static step's after 3 steps at lr 1e-3 (an LSTM's: bit-identical; two static "
    "runs: bit-identical)",
)
def test_the_captured_steps_code_leaves_a_transformer_the_static_steps_weights(static_fit, tiny_shapes, tmp_path):
    _, static = static_fit
    _, graphs = fit_weights(tiny_shapes, tmp_path / "graphs", ["--model.cuda_graphs", "true"])
    for k in static:
        torch.testing.assert_close(graphs[k], static[k], rtol=1e-5, atol=1e-5, msg=k)
