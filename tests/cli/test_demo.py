"""`captioning demo`'s training length: a number of steps by default (the same scores on any machine),
`--steps N`, or a time budget (`--minutes M`) that says in one line when it bought far fewer steps
than the recipe needs; the time and the steps printed; the closing commands runnable as printed."""

import re

import pytest
import yaml

from captioning.cli.demo import DEMO_CONFIGS, DEMO_STEPS, budget_args, run_demo, shortfall
from captioning.cli.main import main
from tests.helpers import ROOT

TINY = dict(n_train=24, n_val=4, n_test=6, image_size=64)
SMALL = ("--data.batch_size", "8", "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false")


def test_the_demo_trains_a_number_of_steps_by_default():
    for config in DEMO_CONFIGS.values():  # the configs keep a time budget for `fit`: the demo replaces it
        trainer = yaml.safe_load((ROOT / "configs" / config).read_text())["trainer"]
        assert "max_time" in trainer and trainer["max_epochs"] * 130 > DEMO_STEPS, config  # 130 steps an epoch
    assert budget_args() == ["--trainer.max_time", "null", "--trainer.max_steps", str(DEMO_STEPS)]
    assert budget_args(steps=300)[-1] == "300"
    assert budget_args(minutes=7) == ["--trainer.max_steps", "-1", "--trainer.max_time", "00:00:07:00"]
    assert budget_args(minutes=0.5)[-1] == "00:00:00:30"
    assert budget_args(max_epochs=3)[-2:] == ["--trainer.max_epochs", "3"] and "null" in budget_args(max_epochs=3)


def test_a_time_budget_that_buys_too_few_steps_says_so_with_the_remedy():
    line = shortfall(78, 420.0, minutes=7)
    assert line.startswith("note: 7 min bought 78 training steps (0.19 steps/s): far fewer than the 1,200")
    assert f"demo --steps {DEMO_STEPS}`" in line and "(about 108 min at this pace)" in line and "\n" not in line
    assert shortfall(DEMO_STEPS // 2, 420.0, minutes=7) is None  # enough for most of the scores
    assert shortfall(78, 420.0, minutes=None) is None  # a step budget buys what it says


def test_the_budgets_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--steps", "10", "--minutes", "3"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--steps", "0"])
    assert "--steps" in capsys.readouterr().err


def test_a_tiny_demo_prints_its_steps_time_and_runnable_commands(tmp_path, capsys):
    report = run_demo(str(tmp_path / "demo"), examples=1, data=TINY, steps=2, threads=1, fit_extra=SMALL)
    printed = capsys.readouterr().out
    assert report["demo_steps"] == 2
    assert "training soft attention on the CPU for 2 steps, 1 thread (configs/shapes_soft.yaml)" in printed
    assert re.search(r"trained 2 steps in [\d.]+ min \([\d.]+ steps/s", printed), printed
    serve = re.search(r"try it in a browser: (\S+) serve --checkpoint ", printed)
    assert serve and serve.group(1).endswith("captioning"), printed
    assert "note: " not in printed  # a step budget buys what it says
