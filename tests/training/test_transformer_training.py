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
