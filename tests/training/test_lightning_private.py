"""The private parts of Lightning the training code relies on, against the installed release: the
checkpoint's validation-loop progress that training/callbacks.py rewrites for a run stopped during a
validation (training/stopping.py ``validation_not_begun``). pyproject.toml names the releases tested."""

import lightning as L
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from captioning.training.stopping import validation_not_begun

KEY = "epoch_loop.val_loop.batch_progress"  # training/callbacks.py's key


def test_the_checkpoint_holds_the_validation_progress_the_callback_rewrites(tmp_path):
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        max_steps=2,
        limit_val_batches=2,
        val_check_interval=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    trainer.save_checkpoint(tmp_path / "x.ckpt", weights_only=False)
    checkpoint = torch.load(tmp_path / "x.ckpt", weights_only=False)
    progress = checkpoint["loops"]["fit_loop"][KEY]
    assert progress["total"]["completed"] == 2  # the two validation batches done
    rewritten = validation_not_begun(progress)
    assert set(rewritten) == set(progress) and set(rewritten["total"]) == set(progress["total"])
    assert rewritten["current"] == {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    # the rewritten state loads back: Lightning reads every field it wrote
    checkpoint["loops"]["fit_loop"][KEY] = rewritten
    torch.save(checkpoint, tmp_path / "y.ckpt")
    again = L.Trainer(default_root_dir=tmp_path, max_steps=3, accelerator="cpu", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=2, val_check_interval=2)  # fmt: skip
    again.fit(BoringModel(), ckpt_path=tmp_path / "y.ckpt", weights_only=False)
    assert again.global_step == 3
