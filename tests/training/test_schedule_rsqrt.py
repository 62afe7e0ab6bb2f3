"""The Transformer's schedule (training/schedules.py: warmup_rsqrt): a linear warm-up to the base
rate, then its inverse square root of the step."""

import math

import pytest
import torch

from captioning.training.schedules import ScheduleConfig, with_schedule


def test_warmup_then_inverse_square_root():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    config = ScheduleConfig(kind="warmup_rsqrt", warmup_steps=4)
    scheduler = with_schedule(optimizer, config)["lr_scheduler"]
    assert scheduler["interval"] == "step"
    lrs = []
    for _ in range(16):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler["scheduler"].step()
    assert lrs[:4] == pytest.approx([0.0005, 0.001, 0.0015, 0.002])  # the warm-up ends at the base rate
    assert lrs[4:] == pytest.approx([0.002 * math.sqrt(4 / (t + 1)) for t in range(4, 16)])
    assert lrs[15] == pytest.approx(0.001)  # a quarter of the way: half the rate at 4x the warm-up


def test_the_schedule_reads_from_a_config_name():
    assert ScheduleConfig(kind="warmup_rsqrt", warmup_steps=10).kind == "warmup_rsqrt"
