"""The LightningDataModule of training: :class:`~captioning.data.captions.CaptionData` (every
setting, reader and loader) with the hooks Lightning calls. Everything that does not train uses
CaptionData itself, without Lightning."""

from __future__ import annotations

from collections.abc import Iterable

import lightning as L
import torch

from captioning.data.captions import CaptionData
from captioning.data.images import decode_batch
from captioning.tokenizers import Tokenizer


class CaptionDataModule(CaptionData, L.LightningDataModule):
    __doc__ = CaptionData.__doc__

    def replicas(self) -> tuple[int, int]:
        """(processes, rank) of the run: the training loader gives each DDP rank its share."""
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def epoch_of(self):
        """The trainer's epoch (a streamed loader's order follows it, also on resume)."""
        return lambda: self.trainer.current_epoch if self.trainer is not None else 0

    def train_tokenizer(self, tokenizer: Tokenizer, texts: Iterable[str]) -> None:
        """Under DDP, rank 0 trains a tokenizer that learns (bpe, unigram) and every other rank takes
        its model: two trainings need not agree (a unigram model's token order, hence its ids, differs
        from one process to the next), and ranks with different ids would average gradients of
        different tokens."""
        trainer = self.trainer
        if trainer is None or trainer.world_size <= 1 or not torch.distributed.is_initialized():
            return super().train_tokenizer(tokenizer, texts)
        state = None
        if trainer.global_rank == 0:
            super().train_tokenizer(tokenizer, texts)
            state = tokenizer.state()
        state = trainer.strategy.broadcast(state, src=0)
        if trainer.global_rank != 0:
            tokenizer.load_state(state)

    def setup(self, stage=None) -> None:
        super().setup(stage)
        spec = getattr(getattr(self.trainer, "lightning_module", None), "spec", None)
        if self.features is not None and spec is not None:  # a cache of another encoder is one line, not wrong inputs
            encoder = spec.encoder
            self.feature_cache().check(encoder=encoder.name, grid_size=encoder.grid_size, pretrained=encoder.pretrained)

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        if self.decode_device is not None:  # JPEG bytes: decoded and resized on the GPU (data/images.py)
            device, root = self.decode_device, getattr(getattr(self.trainer, "strategy", None), "root_device", None)
            if device.index is None and root is not None and root.type == device.type:
                device = root  # this process's GPU (under DDP, its rank's)
            batch = decode_batch(batch, device, self.image_size, self.interpolation)
        return self.drop_bad_images(batch)
