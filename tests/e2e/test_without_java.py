"""Without Java: training, validation, test and evaluate all run; METEOR is reported unavailable
with its reason, on the console and in the metrics file; BLEU, ROUGE-L and CIDEr are computed."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, fit_args


def run(args, env, cwd):
    proc = subprocess.run(
        [sys.executable, "-m", "captioning.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow
def test_fit_test_and_evaluate_without_java(tiny_shapes, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()  # a PATH with no java on it (the interpreter is called by its full path)
    env = {**os.environ, "PATH": str(empty), "PYTHONPATH": str(ROOT)}
    code, out, err = run(fit_args(tiny_shapes, tmp_path / "run", steps=2), env, ROOT)
    assert code == 0, err[-3000:]
    ckpt = next((tmp_path / "run").rglob("last.ckpt"))
    config = [
        "--config",
        str(ROOT / "configs" / "shapes_soft.yaml"),
        "--data.annotations",
        str(tiny_shapes),
        "--data.num_workers",
        "0",
        "--trainer.accelerator",
        "cpu",
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path / "test"),
        "--model.test_generation.max_new_tokens",
        "8",
    ]
    code, out, err = run(["test", *config, "--ckpt_path", ckpt], env, ROOT)
    assert code == 0, err[-3000:]
    assert "test/CIDEr" in out and "test/METEOR" not in out
    metrics = tmp_path / "metrics.json"
    code, out, err = run(
        [
            "evaluate",
            "--checkpoint",
            ckpt,
            "--annotations",
            tiny_shapes,
            "--split",
            "test",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "8",
            "--out",
            metrics,
        ],
        env,
        ROOT,
    )
    assert code == 0, err[-3000:]
    report = json.loads(metrics.read_text())
    assert {"BLEU-4", "ROUGE_L", "CIDEr", "object_f1"} <= set(report["scores"]) and "METEOR" not in report["scores"]
    assert "needs Java" in report["notes"]["METEOR_error"]
    assert "METEOR unavailable: needs Java" in err  # said on the console too
    assert "Traceback" not in err
