"""The documented path for one's own photos (docs/TRAINING.md, "Your own images", which names the
config: `make lint` checks it): the small config trains a dozen images on a CPU, and the checkpoint
captions a folder of them."""

import json
from pathlib import Path

from captioning.cli import main
from captioning.training.cli import run_lightning_cli
from tests.helpers import fit_args, make_karpathy


def test_the_small_config_trains_a_dozen_images_and_captions_them(tmp_path, capsys):
    annotations = make_karpathy(tmp_path, n_train=12, n_val=2, n_test=2, captions=1)
    cli = run_lightning_cli(fit_args(annotations, tmp_path / "run", config="own_small_cnn.yaml", steps=2))
    assert cli.datamodule.image_size == 128 and cli.datamodule.min_word_freq == 1
    checkpoint = Path(cli.trainer.checkpoint_callback.last_model_path)
    capsys.readouterr()
    assert (
        main(["caption", str(tmp_path / "images"), "--checkpoint", str(checkpoint), "--max-new-tokens", "4", "--json"])
        == 0
    )
    assert len(json.loads(capsys.readouterr().out)) == 16
