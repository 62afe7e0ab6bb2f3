"""Every config in configs/ runs a fast fit step on CPU, and what it writes is a usable checkpoint."""

from pathlib import Path

import pytest
import torch

from captioning.models.kinds import decoder_config
from captioning.training.cli import run_lightning_cli
from captioning.training.loading import load_module
from tests.helpers import ROOT, fit_args

CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
SHAPES_CONFIGS = [c for c in CONFIGS if c.startswith("shapes")]


def test_configs_exist():
    assert "shapes_soft.yaml" in CONFIGS


@pytest.mark.parametrize("config", SHAPES_CONFIGS)
def test_config_fits_one_step_and_checkpoints(config, tiny_shapes, tmp_path):
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, config=config, steps=2))
    assert cli.trainer.global_step == 2
    last = Path(cli.trainer.checkpoint_callback.last_model_path)
    assert last.is_file() and str(last).startswith(str(tmp_path))
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["vocabulary"]["itos"][:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert ckpt["hyper_parameters"]["decoder"] == cli.model.hparams.decoder
    kind = decoder_config(ckpt["hyper_parameters"]["decoder"]).attention_kind  # a transformer's is soft by kind
    assert kind == ("hard" if "hard" in config else "soft")
    module = load_module(last)
    for (k, a), b in zip(cli.model.state_dict().items(), module.state_dict().values()):
        assert torch.equal(a.cpu(), b), k
    assert module.hparams.image_size == cli.datamodule.image_size  # linked from data.image_size


def test_print_config(capsys, tiny_shapes):
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            [
                "fit",
                "--config",
                str(ROOT / "configs" / "shapes_soft.yaml"),
                "--data.annotations",
                str(tiny_shapes),
                "--print_config",
            ]
        )
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "image_size: 64" in out
    for group in ("encoder:", "decoder:", "objective:", "optimizer:", "val_generation:", "test_generation:"):
        assert f"\n  {group}" in out, group  # the component groups, under model:
    assert "attention_kind: soft" in out and "class_path: captioning.objectives" in out
