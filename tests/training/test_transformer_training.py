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
    from captioning.models.encoders import EncoderConfig
    from captioning.models.transformer import TransformerConfig
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
            TransformerConfig(hidden_dim=16, heads=4, layers=2, dropout=0.0, aoa=True),
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


def fit_weights(tiny_shapes, root, extra, clip: str = "0.05"):
    """3 steps of a tiny transformer (dropout off, a constant rate, gradient clipping at ``clip``):
    the CLI and its weights."""
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
                clip,
                "--model.optimizer.lr",
                "0.001",
                "--model.optimizer.schedule.kind",
                "none",
                *extra,
            ],
        )
    )
    return cli, {k: v.detach().clone() for k, v in cli.model.state_dict().items()}


def test_a_transformer_trains_with_static_shapes_as_with_the_default_step(tiny_shapes, tmp_path):
    static_cli, static = fit_weights(tiny_shapes, tmp_path / "static", ["--model.static_shapes", "true"])
    _, default = fit_weights(tiny_shapes, tmp_path / "default", [])
    assert static_cli.trainer.global_step == 3 and type(static_cli.model.step_strategy).__name__ == "StaticStep"
    initial = fit_weights(tiny_shapes, tmp_path / "none", ["--trainer.max_steps", "0"])[1]
    moved = [k for k in static if static[k].is_floating_point() and not torch.equal(static[k], initial[k])]
    assert len(moved) > 20  # the steps trained
    for k in static:
        torch.testing.assert_close(default[k], static[k], rtol=1e-4, atol=1e-5, msg=k)


def test_the_captured_steps_code_trains_a_transformer_on_a_cpu_as_the_static_step(tiny_shapes, tmp_path):
    """model.cuda_graphs on a CPU: the captured step's code (manual optimisation: backward,
    clipping moved from the trainer, Adam) runs without capture (capture itself needs a GPU) and
    leaves the static step's weights: bit for bit where the clipping does not bite. Where it bites
    (0.05) the clip's total norm is summed over the parameters in another order (the module's,
    against the optimizer's groups: 20.136644 against 20.136646 at the first step, float32), and
    Adam's normalisation of near-zero gradients turns that rounding into moves below the rate
    (3.4e-4 after 3 steps at lr 1e-3)."""
    for clip, exact in (("1e9", True), ("0.05", False)):
        _, static = fit_weights(tiny_shapes, tmp_path / f"static{clip}", ["--model.static_shapes", "true"], clip)
        graphs_cli, graphs = fit_weights(tiny_shapes, tmp_path / f"graphs{clip}", ["--model.cuda_graphs", "true"], clip)
        assert not graphs_cli.model.automatic_optimization and graphs_cli.trainer.global_step == 3
        assert graphs_cli.model.step_strategy.clip_val == float(clip) and graphs_cli.trainer.gradient_clip_val is None
        captured = graphs_cli.model.step_strategy.graphs
        assert captured is not None and not captured.captured  # ran, not captured
        for k in static:
            if exact:
                assert torch.equal(graphs[k], static[k]), k
            else:
                torch.testing.assert_close(graphs[k], static[k], rtol=0, atol=1e-3, msg=k)  # within one step's move


# ------------------------------------------------------------------ DDP and resume (slow: subprocesses)
DDP_SCRIPT = r"""
import json, os, sys
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from captioning.training.cli import run_lightning_cli

out_dir, annotations, devices, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rank = int(os.environ.get("LOCAL_RANK", 0))


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def on_before_backward(self, trainer, module, loss):
        self.losses.append(float(loss))


args = ["--config", "configs/shapes_transformer.yaml", "--data.annotations", annotations, "--data.batch_size", "8",
        "--data.num_workers", "0", "--data.cache_images", "false", "--trainer.accelerator", "cpu",
        "--trainer.devices", str(devices), "--trainer.strategy", "ddp" if devices > 1 else "auto",
        # max_steps: the warm-up's end is then read from it, not from trainer.estimated_stepping_batches, which
        # builds the training loader before a resumed run restores its mid-epoch position (a known gap)
        "--trainer.max_epochs", "3", "--trainer.max_steps", "1000", "--trainer.max_time", "null",
        "--trainer.limit_val_batches", "0",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", out_dir + "/run",
        "--model.encoder.channels", "[8, 16]", "--model.encoder.dim", "32",
        "--model.decoder.embed_dim", "32", "--model.decoder.hidden_dim", "32", "--model.decoder.ff_dim", "64",
        "--model.decoder.dropout", "0.1",
        "--model.optimizer.schedule.warmup_steps", "3", "--model.optimizer.ema_start_step", "4"]
cli = run_lightning_cli(args, run=False)
losses = Losses()
cli.trainer.callbacks += [losses, ModelCheckpoint(dirpath=out_dir + "/steps", every_n_train_steps=3, save_top_k=-1,
                                                  filename="{step}")]
cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=None if resume == "none" else resume)
torch.save({k: v.detach().clone() for k, v in cli.model.state_dict().items()}, f"{out_dir}/rank{rank}.pt")
with open(f"{out_dir}/rank{rank}.json", "w") as f:
    json.dump({"losses": losses.losses, "world_size": cli.trainer.world_size, "global_step": cli.trainer.global_step,
               "steps_per_epoch": cli.trainer.num_training_batches,
               "kind": cli.model.model.decoder.config.kind}, f)
"""


def run_training(tmp, annotations, devices: int, resume: str = "none") -> list:
    """One fit of a tiny transformer in a fresh process (Lightning's DDP launcher re-runs it per
    rank): per rank, (its record, its final state dict)."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "run_transformer.py").write_text(DDP_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for var in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, str(tmp / "run_transformer.py"), str(tmp), str(annotations), str(devices), resume],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [(json.loads((tmp / f"rank{r}.json").read_text()), torch.load(tmp / f"rank{r}.pt")) for r in range(devices)]


@pytest.fixture(scope="module")
def ddp_data(tmp_path_factory):
    from captioning.data.shapes import generate

    root = tmp_path_factory.mktemp("transformer_ddp")
    return generate(root / "data", n_train=24, n_val=2, n_test=2, seed=7, image_size=64, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [2, 1], ids=["ddp", "single"])
def test_a_transformer_trains_and_a_stopped_run_resumes_to_the_same_weights(devices, ddp_data, tmp_path):
    """2 processes (gloo) or one: a tiny transformer (dropout 0.1, the warm-up, the weight average
    from step 4) trains for 3 epochs, its ranks keeping one set of weights, and learns; a run
    restarted from its mid-epoch checkpoint ends with the uninterrupted run's weights, exactly."""
    whole = run_training(tmp_path / "whole", ddp_data, devices)
    record, weights = whole[0]
    assert record["kind"] == "transformer" and record["world_size"] == devices
    per_epoch = record["steps_per_epoch"]
    assert record["global_step"] == 3 * per_epoch >= 9
    # the weights (batch norm's running statistics are each rank's own since the last forward's broadcast)
    params = [k for k in weights if "running_" not in k and "num_batches_tracked" not in k]
    assert len(params) > 50
    for other, other_weights in whole[1:]:  # DDP: the ranks' gradients averaged, one set of weights
        assert other["losses"] != record["losses"]  # each rank its own half of the data
        assert all(torch.equal(other_weights[k], weights[k]) for k in params)
    # learned: the last epoch's mean loss over the ranks well below the first epoch's (0.74 measured)
    first = sum(sum(r["losses"][:per_epoch]) for r, _ in whole) / (per_epoch * devices)
    last = sum(sum(r["losses"][-per_epoch:]) for r, _ in whole) / (per_epoch * devices)
    assert last < 0.85 * first, (first, last)

    mid = next(s for s in range(3, record["global_step"], 3) if s > per_epoch and s % per_epoch)
    resumed = run_training(
        tmp_path / "resumed", ddp_data, devices, str(tmp_path / "whole" / "steps" / f"step={mid}.ckpt")
    )
    assert resumed[0][0]["global_step"] == record["global_step"]
    for (after, _), (before, _) in zip(resumed, whole):  # every rank: the same batches, dropout and updates
        assert after["losses"] == before["losses"][mid:]
    for rank, ((_, final), (_, reference)) in enumerate(zip(resumed, whole)):
        # rank 0's every tensor; another rank's running statistics restart from rank 0's (the checkpoint's)
        for k in reference if rank == 0 else params:
            assert torch.equal(final[k], reference[k]), (rank, k)
