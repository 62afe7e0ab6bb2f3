"""Distributed data parallel on CPU (gloo): 2 processes train a few steps and test; every test image is
captioned exactly once and the scores equal a single-process test of the same checkpoint.

Each DDP run happens in its own subprocess (Lightning's ddp launcher re-runs the script per rank).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, sys
import torch
import torch.distributed as dist
from captioning.evaluation.evaluator import Evaluator

out_dir, annotations, devices, ckpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
original = Evaluator.predictions


def recording(self, vocab, all_gather=None):
    """Record every rank's test image ids (before de-duplication) and the gathered captions."""
    local = torch.cat(self._ids) if self._ids else torch.zeros(0, dtype=torch.long)
    raw = all_gather(local).flatten(0, 1) if all_gather is not None else local
    predictions = original(self, vocab, all_gather)
    testing = "METEOR" in self.metrics  # the test split's evaluator
    if testing and (not dist.is_initialized() or dist.get_rank() == 0):
        with open(f"{out_dir}/predictions.json", "w") as f:
            json.dump({"raw_ids": raw.tolist(), "local_ids": local.tolist(), "captions": predictions}, f)
    return predictions


Evaluator.predictions = recording
from captioning.training.cli import run_lightning_cli

args = ["--config", "configs/shapes_soft.yaml", "--data.annotations", annotations, "--data.batch_size", "8", "--data.group_captions", "false",
        "--data.bucket_by_length", "true",
        "--data.eval_batch_size", "2", "--data.num_workers", "0", "--trainer.accelerator", "cpu",
        "--trainer.devices", str(devices), "--trainer.strategy", "ddp" if devices > 1 else "auto",
        "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", out_dir + "/run",
        "--model.val_generation.max_new_tokens", "8", "--model.test_generation.max_new_tokens", "8", "--model.test_generation.num_beams", "2"]
cli = run_lightning_cli(args, run=False)  # one trainer: fit, then test on the same process group
trainer = cli.trainer
if ckpt == "train":
    trainer.fit(cli.model, datamodule=cli.datamodule)
    ckpt = trainer.checkpoint_callback.last_model_path
trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
if trainer.is_global_zero:
    with open(f"{out_dir}/result.json", "w") as f:
        json.dump({"ckpt": ckpt, "world_size": trainer.world_size, "global_step": trainer.global_step,
                   "scores": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}}, f)
'''


def run_script(tmp: Path, name: str, source: str, *args) -> None:
    """Write ``source`` to tmp/name and run it in a fresh process (Lightning's DDP launcher re-runs it per rank)."""
    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / name
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for var in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def run(tmp: Path, annotations: Path, devices: int, ckpt: str) -> dict:
    run_script(tmp, "run_ddp.py", SCRIPT, annotations, devices, ckpt)
    result = json.loads((tmp / "result.json").read_text())
    result.update(json.loads((tmp / "predictions.json").read_text()))
    return result


@pytest.mark.slow
def test_ddp_two_processes_caption_each_test_image_once(tmp_path):
    from captioning.data.formats.karpathy import load_karpathy
    from captioning.data.shapes import generate

    annotations = generate(tmp_path / "data", n_train=48, n_val=4, n_test=7, seed=5, image_size=64, progress=False)
    records = load_karpathy(annotations)
    test_ids = sorted(r.image_id for r in records if r.split == "test")
    pairs = sum(len(r.captions) for r in records if r.split == "train")

    ddp = run(tmp_path / "ddp", annotations, 2, "train")
    assert ddp["world_size"] == 2 and ddp["global_step"] == math.ceil(
        math.ceil(pairs / 2) / 8
    )  # each rank trains on half
    # 7 images over 2 ranks: the distributed sampler pads to 8, repeating one image; each appears once in the result
    assert len(ddp["raw_ids"]) == 8 and sorted(set(ddp["raw_ids"])) == test_ids
    assert len(ddp["local_ids"]) == 4  # rank 0 decoded only its half
    assert sorted(int(i) for i in ddp["captions"]) == test_ids

    single = run(tmp_path / "single", annotations, 1, ddp["ckpt"])
    assert single["world_size"] == 1 and sorted(single["raw_ids"]) == test_ids
    assert single["captions"] == ddp["captions"]
    assert single["scores"] and single["scores"].keys() == ddp["scores"].keys()
    for k, v in single["scores"].items():
        assert ddp["scores"][k] == pytest.approx(v, abs=1e-6), k


RANDOMNESS_SCRIPT = r'''
import hashlib, json, os, sys
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from captioning.objectives import HardAttentionReinforce
from captioning.training.cli import run_lightning_cli

out_dir, annotations, resume = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ.get("LOCAL_RANK", 0))
records = []
original = HardAttentionReinforce.forward


def digest(t):
    return hashlib.sha1(t.detach().cpu().numpy().tobytes()).hexdigest()[:12]


def recording(self, model, features, batch, static=False):
    """Per step: the generator state the step draws from, its first dropout mask, its sampled locations."""
    masks = []
    decoder = getattr(model.decoder, "plain", model.decoder)  # the fast twin runs the plain decoder's dropout
    hook = decoder.dropout.register_forward_hook(lambda m, i, o: masks.append(((o == 0) & (i[0] != 0), i[0] != 0)))
    state = digest(torch.random.get_rng_state())
    out = original(self, model, features, batch, static=static)
    hook.remove()
    dropped, nonzero = masks[0]
    records.append({"rng": state, "dropout": digest(dropped), "dropped": (dropped.sum() / nonzero.sum()).item(),
                    "rewards": out.state["reward"].tolist()})
    return out


HardAttentionReinforce.forward = recording
args = ["--config", "configs/shapes_hard.yaml", "--data.annotations", annotations, "--data.batch_size", "8",
        "--data.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", out_dir + "/run",
        "--model.decoder.dropout", "0.3", "--model.objective.init_args.semi_sampling_p", "0.0"]
cli = run_lightning_cli(args, run=False)
every = ModelCheckpoint(dirpath=out_dir + "/steps", every_n_train_steps=2, save_top_k=-1, filename="{step}")
cli.trainer.callbacks.append(every)
cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=None if resume == "none" else resume)
with open(f"{out_dir}/records-{rank}.json", "w") as f:
    json.dump(records, f)
if rank == 0:
    torch.save({k: v for k, v in cli.model.state_dict().items()}, f"{out_dir}/final.pt")
'''


def run_randomness(tmp: Path, annotations: Path, resume: str = "none") -> list:
    run_script(tmp, "run_ddp_random.py", RANDOMNESS_SCRIPT, annotations, resume)
    return [json.loads((tmp / f"records-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_ddp_ranks_draw_their_own_randomness_and_resume_exactly(tmp_path):
    import torch

    from captioning.data.shapes import generate

    annotations = generate(tmp_path / "data", n_train=32, n_val=2, n_test=2, seed=6, image_size=64, progress=False)
    rank0, rank1 = run_randomness(tmp_path / "whole", annotations)
    steps = len(rank0)
    assert steps == len(rank1) >= 6
    # every step, the two ranks draw from different generator states: different dropout masks
    # (a mask depends only on the state and the shape) and their own location samples
    assert all(a["rng"] != b["rng"] for a, b in zip(rank0, rank1))
    assert all(a["dropout"] != b["dropout"] for a, b in zip(rank0, rank1))
    assert all(0.1 < a["dropped"] < 0.5 for a in rank0 + rank1)  # dropout 0.3 really drops
    assert len({r["rng"] for r in rank0}) == steps  # and a new state every step

    # resume from the mid-epoch checkpoint at step 4: the same draws, the same final weights
    mid = tmp_path / "whole" / "steps" / "step=4.ckpt"
    assert mid.is_file()
    resumed0, resumed1 = run_randomness(tmp_path / "resumed", annotations, str(mid))
    assert [r["rng"] for r in resumed0] == [r["rng"] for r in rank0[4:]]
    assert [r["dropout"] for r in resumed1] == [r["dropout"] for r in rank1[4:]]
    assert [r["rewards"] for r in resumed1] == [r["rewards"] for r in rank1[4:]]
    whole, resumed = torch.load(tmp_path / "whole" / "final.pt"), torch.load(tmp_path / "resumed" / "final.pt")
    for k, v in whole.items():
        assert torch.equal(resumed[k], v), k
