"""The GPU check's own parts (tools/benchmarks/gpu_check.py): the rate it reads from fit's progress
lines, the report it writes, a failure stopping the run with the command that reproduces it, and
the refusal to run without CUDA unless asked for the dry run. The whole dry run (the CPU, tiny sizes)
runs in CI: `make gpu-check GPU_CHECK_ARGS=--dry-run` (.ci/run)."""

import json
import sys

import pytest

from tools.benchmarks import gpu_check


def test_the_rate_is_the_last_progress_lines():
    output = (
        "checkpoints: x\nepoch 0  step 2  loss 70.125  0.50 steps/s  0.1 min\n"
        "epoch 0  step 4  loss 61.500  2.25 steps/s  0.2 min\nvalidation after step 4: BLEU-1 0.1\n"
    )
    assert gpu_check._RATE.findall(output)[-1] == ("4", "61.500", "2.25")
    assert gpu_check._finite("61.5") and not gpu_check._finite("nan") and not gpu_check._finite("inf")


def test_a_failure_stops_the_run_and_the_report_names_the_command(tmp_path, monkeypatch):
    check = gpu_check.GpuCheck(tmp_path, True, gpu_check.DRY, "cpu", 1)
    check.row("data", "shapes (PNG)", "ok", images=60, seconds=0.9)
    monkeypatch.setattr(gpu_check.sys, "executable", sys.executable)
    with pytest.raises(gpu_check.CheckFailed) as info:
        check.run("fit", "soft eager", ["fit", "--no-such-flag"])
    assert "reproduce with:" in str(info.value) and "captioning.cli fit --no-such-flag" in str(info.value)
    json_path, md_path = check.report()
    data = json.loads(json_path.read_text())
    assert [r["status"] for r in data["rows"]] == ["ok", "FAILED"]
    assert (
        data["failure"].startswith("fit / soft eager: exit 1") and "reproduce:" in data["failure"]
    )  # fit: no --config
    table = md_path.read_text()
    assert "| data | shapes (PNG) | ok |  |  |  | 0.90 |" in table and "**Failed**: fit / soft eager" in table


def test_without_cuda_it_runs_only_as_a_dry_run(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", "unused"]) == 2
    assert "run with --dry-run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--sections", "fit,nope"])
