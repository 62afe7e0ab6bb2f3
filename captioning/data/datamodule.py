"""The LightningDataModule of training: :class:`~captioning.data.captions.CaptionData` (every
setting, reader and loader) with the hooks Lightning calls. Everything that does not train uses
CaptionData itself, without Lightning."""

from __future__ import annotations

import lightning as L

from captioning.data.captions import CaptionData


class CaptionDataModule(CaptionData, L.LightningDataModule):
    __doc__ = CaptionData.__doc__

    def replicas(self) -> tuple[int, int]:
        """(processes, rank) of the run: the training loader gives each DDP rank its share."""
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def epoch_of(self):
        """The trainer's epoch (a streamed loader's order follows it, also on resume)."""
        return lambda: self.trainer.current_epoch if self.trainer is not None else 0

    def setup(self, stage=None) -> None:
        super().setup(stage)
        spec = getattr(getattr(self.trainer, "lightning_module", None), "spec", None)
        if self.features is not None and spec is not None:  # a cache of another encoder is one line, not wrong inputs
            encoder = spec.encoder
            self.feature_cache().check(encoder=encoder.name, grid_size=encoder.grid_size, pretrained=encoder.pretrained)

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        return self.drop_bad_images(batch)
