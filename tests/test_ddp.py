"""Distributed data parallel on CPU (gloo): 2 processes train a few steps and test; every test image is
captioned exactly once and the scores equal a single-process test of the same checkpoint.

Each DDP run happens in its own subprocess (Lightning's ddp launcher re-runs the script per rank).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json, sys
import torch
from captioning.module import CaptioningModule

out_dir, annotations, devices, ckpt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
original = CaptioningModule._gathered_predictions


def recording(self):
    """Record every rank's test image ids (before de-duplication) and the gathered captions."""
    local = torch.cat([i for i, _ in self._predictions]) if self._predictions else torch.zeros(0, dtype=torch.long)
    raw = self.all_gather(local).flatten(0, 1) if self.trainer.world_size > 1 else local
    predictions = original(self)
    if self.trainer.testing and self.trainer.is_global_zero:
        with open(f"{out_dir}/predictions.json", "w") as f:
            json.dump({"raw_ids": raw.tolist(), "local_ids": local.tolist(), "captions": predictions}, f)
    return predictions


CaptioningModule._gathered_predictions = recording
from captioning.cli import lightning_cli

args = ["--config", "configs/shapes_soft.yaml", "--data.annotations", annotations, "--data.batch_size", "8", "--data.group_captions", "false",
        "--data.bucket_by_length", "true",
        "--data.eval_batch_size", "2", "--data.num_workers", "0", "--trainer.accelerator", "cpu",
        "--trainer.devices", str(devices), "--trainer.strategy", "ddp" if devices > 1 else "auto",
        "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", out_dir + "/run",
        "--model.max_new_tokens", "8", "--model.test_num_beams", "2"]
cli = lightning_cli(args, run=False)  # one trainer: fit, then test on the same process group
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


def run(tmp: Path, annotations: Path, devices: int, ckpt: str) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    script = tmp / "run_ddp.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for var in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, str(script), str(tmp), str(annotations), str(devices), ckpt],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp / "result.json").read_text())
    result.update(json.loads((tmp / "predictions.json").read_text()))
    return result


@pytest.mark.slow
def test_ddp_two_processes_caption_each_test_image_once(tmp_path):
    from captioning.data.karpathy import load_karpathy
    from captioning.data.shapes import generate

    annotations = generate(tmp_path / "data", n_train=48, n_val=4, n_test=7, seed=5, image_size=64, progress=False)
    records = load_karpathy(annotations)
    test_ids = sorted(r.image_id for r in records if r.split == "test")
    pairs = sum(len(r.captions) for r in records if r.split == "train")

    ddp = run(tmp_path / "ddp", annotations, 2, "train")
    assert ddp["world_size"] == 2 and ddp["global_step"] == -(-(-(-pairs // 2)) // 8)  # each rank trains on half
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
