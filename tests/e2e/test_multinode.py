"""Two nodes rehearsed on one machine: torchrun --nnodes 2 --nproc-per-node 1, started twice on
127.0.0.1 (gloo, static rendezvous on a free port, --node-rank 0 and 1), trains from WebDataset shards
for two epochs and tests: every training pair is seen exactly once per epoch across the two nodes,
and the test split is decoded half per node and scored once (one metrics file, every test image)."""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.data.captions import CaptionData

pytest.importorskip("webdataset", reason="the ecosystem extra: pip install -e '.[ecosystem]'")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import json, os, sys
import torch
from lightning.pytorch.callbacks import Callback
from captioning.evaluation.evaluator import Evaluator
from captioning.training.cli import run_lightning_cli

out_dir, shards = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
original = Evaluator.predictions


def recording(self, vocab, all_gather=None):
    """Record the test images this node decoded."""
    if "METEOR" in self.metrics:  # the test split's evaluator
        local = torch.cat(self._ids) if self._ids else torch.zeros(0, dtype=torch.long)
        with open(f"{out_dir}/test-ids-{rank}.json", "w") as f:
            json.dump(local.tolist(), f)
    return original(self, vocab, all_gather)


Evaluator.predictions = recording


class Pairs(Callback):
    """Every (image id, caption ids) pair this node trains on, per epoch."""

    def __init__(self):
        self.seen = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pairs = self.seen.setdefault(trainer.current_epoch, [])
        for i, row in enumerate(batch["captions"]):
            pairs.append([int(batch["image_ids"][i]), row[: int(batch["lengths"][i])].tolist()])

    def on_train_end(self, trainer, pl_module):
        with open(f"{out_dir}/pairs-{rank}.json", "w") as f:
            json.dump(self.seen, f)


args = ["--config", "configs/shapes_soft.yaml", "--data.annotations", shards, "--data.batch_size", "8",
        "--data.eval_batch_size", "2", "--data.num_workers", "1", "--trainer.accelerator", "cpu",
        "--trainer.devices", "1", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp",
        "--trainer.max_epochs", "2", "--trainer.max_time", "null", "--trainer.limit_val_batches", "1",
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
        "--trainer.default_root_dir", out_dir + "/run", "--model.val_generation.max_new_tokens", "6",
        "--model.test_generation.max_new_tokens", "8", "--model.test_generation.num_beams", "2"]
cli = run_lightning_cli(args, run=False)
trainer = cli.trainer
trainer.callbacks.append(Pairs())
trainer.fit(cli.model, datamodule=cli.datamodule)
trainer.test(cli.model, datamodule=cli.datamodule)
if trainer.is_global_zero:
    with open(f"{out_dir}/metrics-{rank}.json", "w") as f:
        json.dump({"world_size": trainer.world_size, "num_nodes": trainer.num_nodes, "global_step": trainer.global_step,
                   "scores": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("test/")}}, f)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_train_from_shards_and_score_the_test_split_once(tiny_shapes, tmp_path):
    shards = tmp_path / "shards"
    assert (
        main(
            [
                "prepare",
                "--annotations",
                str(tiny_shapes),
                "--min-word-freq",
                "1",
                "--to-webdataset",
                str(shards),
                "--shard-size",
                "8",
                "--no-image-check",
            ]
        )
        == 1
    )  # the writer reads every image: refused
    assert (
        main(
            [
                "prepare",
                "--annotations",
                str(tiny_shapes),
                "--min-word-freq",
                "1",
                "--to-webdataset",
                str(shards),
                "--shard-size",
                "8",
            ]
        )
        == 0
    )
    script = tmp_path / "node.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(var, None)
    port = free_port()
    logs = [tmp_path / f"node-{node}.log" for node in (0, 1)]  # files, not pipes: a full pipe would stall a node
    with logs[0].open("w") as out0, logs[1].open("w") as out1:
        nodes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--node-rank",
                    str(node),
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                    str(script),
                    str(tmp_path),
                    str(shards),
                ],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            for node, out in ((0, out0), (1, out1))
        ]
        try:
            for node in nodes:
                node.wait(timeout=300)
        finally:
            for node in nodes:
                node.kill()
    for node, log in zip(nodes, logs):
        assert node.returncode == 0, log.read_text()[-4000:]

    data = CaptionData(str(shards), min_word_freq=1, max_length=30)
    data.setup()
    expected = Counter((r.image_id, tuple(data.vocab.encode(t, 30))) for r in data.records("train") for t in r.tokens)
    seen = [json.loads((tmp_path / f"pairs-{rank}.json").read_text()) for rank in (0, 1)]
    for epoch in ("0", "1"):
        per_node = [Counter((i, tuple(c)) for i, c in node[epoch]) for node in seen]
        assert len(seen[0][epoch]) == len(seen[1][epoch]) == 100  # 200 pairs: half per node
        assert per_node[0] + per_node[1] == expected  # each pair exactly once in the epoch
    assert [p for p, _ in seen[0]["0"]] != [p for p, _ in seen[0]["1"]]  # another order each epoch

    test_ids = sorted(r.image_id for r in data.records("test"))
    decoded = [json.loads((tmp_path / f"test-ids-{rank}.json").read_text()) for rank in (0, 1)]
    assert len(decoded[0]) == len(decoded[1]) == 4 and sorted(decoded[0] + decoded[1]) == test_ids
    metrics = sorted(tmp_path.glob("metrics-*.json"))
    assert [m.name for m in metrics] == ["metrics-0.json"]  # scored once
    result = json.loads(metrics[0].read_text())
    assert result["world_size"] == 2 and result["num_nodes"] == 2 and result["global_step"] == 2 * 13
    assert {"test/BLEU-4", "test/CIDEr", "test/object_f1"} <= set(result["scores"])
