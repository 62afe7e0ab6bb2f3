"""tools/studies/transformer_study.py: a row's seeds, their test scores and the validation object F1
at equal CPU seconds, read from run folders (test_last.json and the TensorBoard curve)."""

import json

import pytest


def _run(root, name, f1_curve, test_f1=None):
    """A run folder: the validation object F1 logged at (step count - 1, value) pairs, and a
    test_last.json when ``test_f1`` is given (a finished run)."""
    from torch.utils.tensorboard import SummaryWriter

    logs = root / name / "lightning_logs" / "version_0"
    writer = SummaryWriter(str(logs))
    for steps, value in f1_curve:
        writer.add_scalar("val/object_f1", value, steps - 1)  # Lightning logs the step count less one
    writer.close()
    if test_f1 is not None:
        scores = {"object_f1": test_f1, "CIDEr": 6.0, "grounding": {"attention_correctness": 0.5, "pointing_game": 0.8}}
        (root / name / "test_last.json").write_text(json.dumps({"scores": scores}))


def test_the_table_interpolates_each_rows_curve_at_its_equal_cpu_budget(tmp_path, capsys):
    from tools.studies import transformer_study

    _run(tmp_path, "soft_s0", [(100, 0.2), (200, 0.6)], test_f1=0.9)
    _run(tmp_path, "slow_s0", [(100, 0.4), (200, 0.8)], test_f1=0.7)
    _run(tmp_path, "fast_s0", [(100, 0.1), (200, 0.3)], test_f1=0.5)
    _run(tmp_path, "fast_s1", [(100, 0.9)])  # still running: no test_last.json, so not counted
    speed = {
        "rows": {
            name: {
                "train_ms_cpu": ms,
                "train_ratio": ms / 100,
                "beam3_images_per_s_cpu": 10,
                "beam3_ratio": 1,
                "parameters": 1e6,
            }
            for name, ms in (("soft", 100), ("slow", 125), ("fast", 80))
        }
    }
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    args = ["--runs-dir", str(tmp_path), "--speed", str(tmp_path / "speed.json"), "--budget-steps", "200"]
    transformer_study.main(args + ["--row", "soft=soft_s0", "--row", "slow=slow_s0", "--row", "fast=fast_s0,fast_s1"])
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["soft"][-2:] == ["200", "0.600 |"]
    # slow: 200 x 100 / 125 = 160 steps, 0.4 + 0.6 x 0.4 = 0.64 on its curve
    assert rows["slow"][-2:] == ["160", "0.640 |"]
    # fast: 250 steps lie past its run's 200: its last validation, marked; the running seed is left out
    assert rows["fast"][-2:] == ["250", ">= 0.300 (0.300 / n/a) |"]
    assert rows["fast"][2] == "0.500 (0.500 / n/a)"


def test_value_at_interpolates_between_validations():
    import numpy as np

    from tools.studies.transformer_study import value_at

    curve = (np.array([131, 262]), np.array([0.2, 0.4]))
    assert value_at(curve, 196.5) == (pytest.approx(0.3), True)
    assert value_at(curve, 300) == (pytest.approx(0.4), False)
