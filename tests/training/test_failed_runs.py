"""A `fit` that fails before its first step (its data refused in setup) leaves no run folder of its
own: no empty lightning_logs/version_N for the next run to be numbered past; an earlier run's
folder is kept."""

import pytest

from captioning.errors import CaptioningError
from captioning.training.cli import run_lightning_cli
from tests.helpers import fit_args


def logged(annotations, root) -> list[str]:
    """fit_args with TensorBoard's logger on (the default a user gets)."""
    args = fit_args(annotations, root, steps=1)
    at = args.index("--trainer.logger")
    args[at + 1] = "true"
    return args


def test_a_fit_whose_data_is_refused_leaves_no_empty_run_folder(tmp_path):
    root = tmp_path / "root"
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [')  # refused by the data module's setup, after the trainer is made
    with pytest.raises(CaptioningError, match="malformed JSON"):
        run_lightning_cli(logged(bad, root))
    assert not (root / "lightning_logs").exists()

    earlier = root / "lightning_logs" / "version_0"  # an earlier run's folder is kept
    earlier.mkdir(parents=True)
    (earlier / "events.out.tfevents.1.host.1.0").write_bytes(b"an earlier run's curves")
    with pytest.raises(CaptioningError, match="malformed JSON"):
        run_lightning_cli(logged(bad, root))
    assert sorted(p.name for p in (root / "lightning_logs").iterdir()) == ["version_0"]  # no version_1
    assert [p.name for p in earlier.iterdir()] == ["events.out.tfevents.1.host.1.0"]
