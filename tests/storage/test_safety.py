"""Nobody let in, nothing lost: checkpoints that would run code, checkpoints that do not fit,
interrupted writes, non-finite losses and unknown settings."""

import errno
import os
import subprocess
import sys

import pytest
import torch

from captioning.errors import CaptioningError, CheckpointError
from captioning.files import atomic_write_json, safe_torch_load
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.storage.load import load_model
from captioning.training.module import CaptioningModule
from captioning.vocab import Vocabulary


def run_cli(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "captioning.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout, proc.stderr


class RunsCode:
    """Unpickling this calls os.system: the classic malicious checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_checkpoint(tmp_path, source=None):
    """A checkpoint that looks real (a real one's keys and weights) but carries a code-running object."""
    marker = tmp_path / "pwned"
    ckpt = safe_torch_load(source) if source else {"state_dict": {}, "hyper_parameters": {}, "vocabulary": {}}
    ckpt["hyper_parameters"]["payload"] = RunsCode(marker)
    path = tmp_path / "evil.ckpt"
    torch.save(ckpt, path)
    return path, marker


def test_code_running_checkpoint_is_refused_by_load_model(tmp_path, tiny_checkpoint):
    path, marker = evil_checkpoint(tmp_path, tiny_checkpoint)
    with pytest.raises(CheckpointError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message and "evil.ckpt" in message and "refused" in message
    assert not marker.exists()
    # pickle itself would have run it: the test's payload is real
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_code_running_checkpoint_is_refused_by_the_cli(tmp_path, tiny_checkpoint, tiny_shapes):
    path, marker = evil_checkpoint(tmp_path, tiny_checkpoint)
    image = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
    code, out, err = run_cli("caption", image, "--checkpoint", path)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "evil.ckpt" in err and "refused" in err and "Traceback" not in err
    assert not marker.exists()


def mutated(tmp_path, tiny_checkpoint, change):
    ckpt = safe_torch_load(tiny_checkpoint)
    change(ckpt)
    path = tmp_path / "other.ckpt"
    torch.save(ckpt, path)
    return path


def checkpoint_error(path):
    with pytest.raises(CheckpointError) as info:
        load_model(path)
    assert "\n" not in str(info.value) and "other.ckpt" in str(info.value)
    return str(info.value)


def test_checkpoint_of_another_vocabulary_or_architecture(tmp_path, tiny_checkpoint):
    def more_words(c):
        c["vocabulary"]["itos"] = c["vocabulary"]["itos"] + ["zebra", "giraffe"]

    def wider(c):
        c["hyper_parameters"]["decoder"]["hidden_dim"] *= 2

    def future_setting(c):
        c["hyper_parameters"]["quantum_attention"] = True

    def future_decoder_setting(c):
        c["hyper_parameters"]["decoder"]["quantum_attention"] = True

    def unknown_objective(c):
        c["hyper_parameters"]["objective"]["class_path"] = "os.system"

    def bad_vocab(c):
        c["vocabulary"] = {"itos": ["a", "b"]}

    for change in (more_words, wider):
        assert "weights do not fit" in checkpoint_error(mutated(tmp_path, tiny_checkpoint, change))
    for change in (future_setting, future_decoder_setting):
        assert "do not fit this version" in checkpoint_error(mutated(tmp_path, tiny_checkpoint, change))
    assert "unknown objective 'os.system'" in checkpoint_error(mutated(tmp_path, tiny_checkpoint, unknown_objective))
    with pytest.raises(CaptioningError):
        load_model(mutated(tmp_path, tiny_checkpoint, bad_vocab))
    assert "no 'vocabulary'" in checkpoint_error(mutated(tmp_path, tiny_checkpoint, lambda c: c.pop("vocabulary")))
    torch.save([1, 2], tmp_path / "other.ckpt")
    assert "expected a dictionary" in checkpoint_error(tmp_path / "other.ckpt")


# ---------------------------------------------------------------------- interrupted writes
def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def no_temporaries(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("where", ["fsync", "write"])
def test_disk_full_leaves_previous_files_intact(tmp_path, monkeypatch, where):
    ckpt, meta, vocab_path = tmp_path / "m.ckpt", tmp_path / "m.json", tmp_path / "vocab.json"
    vocab = Vocabulary.build([["a", "dog"]], min_freq=1)
    torch.save({"w": torch.ones(3)}, ckpt)
    atomic_write_json(meta, {"v": 1})
    vocab.save(vocab_path)
    before = {p: p.read_bytes() for p in (ckpt, meta, vocab_path)}

    if where == "fsync":  # the data went to the page cache, the disk refused it
        monkeypatch.setattr(os, "fsync", disk_full)
    else:  # the write itself fails part way: half the bytes land, then the disk is full
        real_fdopen = os.fdopen

        class FullDisk:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                self.f.write(bytes(data)[: len(data) // 2])
                disk_full()

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: FullDisk(real_fdopen(fd, mode, *a, **k)))
    for write in (
        lambda: atomic_write_json(meta, {"v": 2}),
        lambda: Vocabulary.build([["a", "cat"]], min_freq=1).save(vocab_path),
    ):
        with pytest.raises(OSError) as info:
            write()
        assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in before} == before
    assert no_temporaries(tmp_path)
    assert torch.equal(safe_torch_load(ckpt)["w"], torch.ones(3)) and Vocabulary.load(vocab_path) == vocab


# ---------------------------------------------------------------------- non-finite losses
def small_module(nonfinite_loss):
    torch.manual_seed(0)
    vocab = Vocabulary.build([["a", "red", "circle"]], min_freq=1)
    module = CaptioningModule(
        EncoderConfig(channels=(4, 8, 8), dim=8),
        DecoderConfig(8, 8, 8, dropout=0.0),
        image_size=16,
        nonfinite_loss=nonfinite_loss,
    )
    module.set_vocab(vocab)
    return module


def nan_batches(n=3):
    captions = torch.tensor([[1, 4, 5, 6, 2]] * 2)
    images = torch.rand(2, 3, 16, 16)
    images[0, 0, 0, 0] = float("nan")
    batch = {"images": images, "captions": captions, "lengths": torch.tensor([5, 5]), "image_ids": torch.tensor([0, 1])}
    return [batch] * n


def nan_loader():
    from torch.utils.data import DataLoader

    return DataLoader(nan_batches(), batch_size=None)


def tiny_trainer(**kw):
    import tempfile

    import lightning as L

    # the module's own ModelCheckpoint writes under default_root_dir: keep it out of the working tree
    return L.Trainer(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(),
        **kw,
    )


def test_nan_loss_stops_training_naming_the_step():
    module = small_module("error")
    with pytest.raises(CaptioningError) as info:
        module.training_step(nan_batches()[0], 0)
    assert "non-finite loss" in str(info.value) and "global step 0" in str(info.value)
    assert "nonfinite_loss skip" in str(info.value)
    with pytest.raises(CaptioningError, match="global step 0"):
        tiny_trainer().fit(module, train_dataloaders=nan_loader())


def test_nan_loss_skip_leaves_the_weights_unchanged(caplog):
    module = small_module("skip")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    assert module.training_step(nan_batches()[0], 0) is None
    trainer = tiny_trainer(limit_val_batches=0)
    with caplog.at_level("WARNING", logger="captioning.training.guards"):
        trainer.fit(module, train_dataloaders=nan_loader())
    changed = [k for k, v in module.named_parameters() if not torch.equal(before[k], v)]
    assert changed == []  # no optimizer step was taken
    assert "step skipped" in caplog.text and "global step 0" in caplog.text
    assert trainer.callback_metrics["train/skipped_steps"] == 3


# ---------------------------------------------------------------------- settings
def test_unknown_config_key_is_a_clear_error(tiny_shapes, tmp_path):
    code, _, err = run_cli(
        "fit",
        "--config",
        "configs/shapes_soft.yaml",
        "--data.annotations",
        tiny_shapes,
        "--trainer.default_root_dir",
        tmp_path,
        "--model.nonexistent",
        "1",
    )
    assert code != 0 and "nonexistent" in err and "Traceback" not in err
    code, _, err = run_cli(
        "fit",
        "--config",
        "configs/shapes_soft.yaml",
        "--data.annotations",
        tiny_shapes,
        "--trainer.default_root_dir",
        tmp_path,
        "--model.decoder.attention_kind",
        "telepathic",
    )
    assert code != 0 and "attention_kind" in err and "Traceback" not in err


def test_nan_loss_skip_leaves_batchnorm_statistics_unchanged():
    module = small_module("skip")
    before = {k: v.clone() for k, v in module.named_buffers()}
    tiny_trainer(limit_val_batches=0).fit(module, train_dataloaders=nan_loader())
    assert [k for k, v in module.named_buffers() if not torch.equal(before[k], v)] == []
