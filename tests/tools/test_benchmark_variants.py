"""tools/benchmarks/benchmark.py's ``variants`` section: every decoder kind's config is timed."""

import pytest
import torch

from tools.benchmarks.benchmark import bench_variants, output_layer


def test_the_variants_section_times_every_kind_of_decoder():
    torch.manual_seed(0)
    rows = bench_variants(torch.device("cpu"), quick=True, rounds=1, names=("soft", "transformer", "conv"))
    assert [r["variant"] for r in rows] == ["soft", "transformer", "conv"]
    assert rows[0]["train_ratio"] == 1.0  # the ratios are to the first (soft attention's) step
    for r in rows:
        assert r["train_ms_per_step"] > 0 and r["beam3_images_per_s"] > 0 and r["params"] > 0
    assert len({r["params"] for r in rows}) == 3  # three different models were built


def test_the_output_layer_of_each_kind_and_a_clear_error_without_one():
    from captioning.models.kinds import decoder_config

    for kind, name in (("lstm", "L_o"), ("transformer", "out_logits"), ("conv", "W_o")):
        decoder = decoder_config({"kind": kind}).build(11, 16)
        assert output_layer(decoder) is getattr(decoder, name) and output_layer(decoder).out_features == 11
    with pytest.raises(ValueError, match="Linear: no output layer among L_o, out_logits, W_o"):
        output_layer(torch.nn.Linear(2, 2))
