"""The LightningModule: wires the encoder and decoder to training, decoding and scoring.

The models know nothing of Lightning; this file holds the losses of a training step (NLL, doubly
stochastic attention, REINFORCE for hard attention), real decoding in validation and test (no
teacher forcing), coco-caption scoring of the decoded captions, and the checkpoint's self-description
(hyperparameters and vocabulary inside).
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from captioning.errors import CaptioningError, ConfigError
from captioning.losses import caption_log_likelihood, doubly_stochastic_penalty, reinforce_loss, update_baseline
from captioning.models.attention import CONTEXT_MODES
from captioning.models.decoder import ShowAttendTellDecoder
from captioning.models.encoders import build_encoder
from captioning.models.search import GenerationOutput, generate
from captioning.vocab import Vocabulary

log = logging.getLogger(__name__)


class CaptioningModule(L.LightningModule):
    """Show, Attend and Tell with soft or hard attention.

    Args:
        encoder: "small_cnn", "resnet50/101/152", "vgg16/19" (see models/encoders.py).
        pretrained / encoder_weights: ImageNet weights from torchvision, or a local file.
        grid_size: pool the encoder's grid to grid_size x grid_size (None: as it comes).
        fine_tune_blocks: top blocks of a torchvision encoder to train, at ``encoder_lr``.
        encoder_channels / encoder_dim: widths of the small CNN.
        embed_dim, hidden_dim, attention_dim, dropout, prev2out, ctx2out: the decoder (decoder.py).
        attention: "soft" or "hard".
        doubly_stochastic: lambda of Eq. 14 (1 in the authors' COCO recipe; 0 switches it off).
        lr, weight_decay: Adam on the decoder (and on a from-scratch encoder).
        lambda_r, lambda_e, baseline_decay, semi_sampling_p, semi_sampling_per, num_samples,
        reward_per_step: hard attention's REINFORCE (losses.py); semi_sampling_per is "batch"
            (the authors' code, default) or "image" (the paper).
        inference_attention: how a hard model picks contexts when decoding: "expected" (default,
            the authors' caption script), "argmax" or "sample".
        val_num_beams / test_num_beams / max_new_tokens / length_penalty: decoding in validation and test.
        nonfinite_loss: "error" stops at a NaN/inf loss, "skip" skips that step; both name the step.
        channels_last: run the encoder in the channels-last memory format (faster convolutions on
            GPUs with tensor cores, under bf16 or fp16).
        compile_decoder: ``torch.compile`` the decoder's time step (the LSTM + attention step that
            training and decoding repeat), with dynamic shapes. Compiling takes a while on first
            use; see tools/benchmark.py --compile for what it gains on your machine.
        image_size: the side the images are resized to; linked to ``data.image_size`` by the CLI
            and kept in the checkpoint, so that captioning new images resizes them the same way.
        vocab: filled in from the data (or a checkpoint); not a setting.
    """

    def __init__(
        self,
        encoder: str = "small_cnn",
        pretrained: bool = True,
        encoder_weights: Optional[str] = None,
        grid_size: Optional[int] = None,
        fine_tune_blocks: int = 0,
        encoder_lr: Optional[float] = None,
        encoder_channels: tuple = (32, 64, 128),
        encoder_dim: int = 256,
        embed_dim: int = 512,
        hidden_dim: int = 512,
        attention_dim: int = 512,
        dropout: float = 0.5,
        prev2out: bool = True,
        ctx2out: bool = True,
        attention: str = "soft",
        doubly_stochastic: float = 1.0,
        lr: float = 2e-4,
        weight_decay: float = 0.0,
        lambda_r: float = 0.1,
        lambda_e: float = 0.002,
        baseline_decay: float = 0.9,
        semi_sampling_p: float = 0.5,
        semi_sampling_per: str = "batch",
        num_samples: int = 1,
        reward_per_step: bool = True,
        inference_attention: str = "expected",
        val_num_beams: int = 1,
        test_num_beams: int = 3,
        max_new_tokens: int = 30,
        length_penalty: float = 1.0,
        nonfinite_loss: str = "error",
        channels_last: bool = False,
        compile_decoder: bool = False,
        image_size: int = 224,
        vocab: Optional[dict] = None,
    ):
        super().__init__()
        if attention not in ("soft", "hard"):
            raise ConfigError(f"model.attention: expected 'soft' or 'hard', got {attention!r}")
        if inference_attention not in CONTEXT_MODES:
            raise ConfigError(f"model.inference_attention: expected one of {CONTEXT_MODES}, got {inference_attention!r}")
        if semi_sampling_per not in ("batch", "image"):
            raise ConfigError(f"model.semi_sampling_per: expected 'batch' or 'image', got {semi_sampling_per!r}")
        if nonfinite_loss not in ("error", "skip"):
            raise ConfigError(f"model.nonfinite_loss: expected 'error' or 'skip', got {nonfinite_loss!r}")
        self.save_hyperparameters(ignore=["vocab"])
        if isinstance(self.hparams.get("encoder_channels"), list):
            self.hparams["encoder_channels"] = tuple(self.hparams["encoder_channels"])
        extra = {"channels": tuple(encoder_channels), "out_dim": encoder_dim} if encoder == "small_cnn" else {}
        self.encoder = build_encoder(encoder, pretrained, encoder_weights, grid_size, fine_tune_blocks, **extra)
        if channels_last:
            self.encoder = self.encoder.to(memory_format=torch.channels_last)
        self.register_buffer("baseline", torch.zeros(()))  # REINFORCE baseline b, saved in checkpoints
        self.vocab: Optional[Vocabulary] = None
        self.decoder: Optional[ShowAttendTellDecoder] = None
        self._scorer, self._scorer_metrics = None, None
        self._predictions: list = []
        if vocab is not None:
            self.set_vocab(Vocabulary.from_dict(vocab))

    # ------------------------------------------------------------------ building
    def set_vocab(self, vocab: Vocabulary) -> None:
        """Build the decoder for ``vocab`` (once; the vocabulary must not change afterwards)."""
        if self.decoder is not None:
            if vocab.itos != self.vocab.itos:
                raise ConfigError(
                    f"the data's vocabulary ({len(vocab)} words) differs from the model's ({len(self.vocab)} words)"
                )
            return
        h = self.hparams
        self.vocab = vocab
        self.decoder = ShowAttendTellDecoder(
            len(vocab), self.encoder.out_dim, h.embed_dim, h.hidden_dim, h.attention_dim, h.dropout,
            h.attention, h.prev2out, h.ctx2out, vocab.pad_id,
        )
        if h.get("compile_decoder"):
            self.decoder.compile_step()

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is None:
            if self.decoder is None:
                raise ConfigError("the model has no vocabulary: train it with a datamodule or load a checkpoint")
            return
        if self.decoder is not None and getattr(dm, "vocab", None) is None and hasattr(dm, "set_vocab"):
            dm.set_vocab(self.vocab)
        if getattr(dm, "vocab", None) is None:
            dm.setup(stage)
        self.set_vocab(dm.vocab)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["vocabulary"] = self.vocab.to_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "vocabulary" in checkpoint:
            self.set_vocab(Vocabulary.from_dict(checkpoint["vocabulary"]))

    def train(self, mode: bool = True) -> "CaptioningModule":
        """Train mode, except that frozen batch-norm layers keep their ImageNet statistics."""
        super().train(mode)
        for m in self.encoder.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not any(p.requires_grad for p in m.parameters()):
                m.eval()
        return self

    def configure_callbacks(self):
        # Keep the best checkpoint by validation CIDEr, and the last one for resuming. Lightning lets
        # these replace every ModelCheckpoint given to the Trainer, so one the user configured with
        # a step interval (--trainer.callbacks ModelCheckpoint --trainer.callbacks.every_n_train_steps N
        # --trainer.callbacks.save_last true) is kept beside it: last.ckpt every N steps, for resuming
        # a run killed mid-epoch. Lightning's own default ModelCheckpoint has no step interval.
        trainer = self._trainer
        stepwise = [c for c in (trainer.callbacks if trainer is not None else [])
                    if isinstance(c, ModelCheckpoint) and c._every_n_train_steps]
        save_last = not any(c.save_last for c in stepwise)  # one writer of last.ckpt, not last-v1.ckpt
        best = ModelCheckpoint(monitor="val/CIDEr", mode="max", save_last=save_last, filename="best-{epoch}-{step}")
        return [best, *stepwise]

    def configure_optimizers(self):
        h = self.hparams
        encoder_params = [p for p in self.encoder.parameters() if p.requires_grad]
        groups = [{"params": [p for p in self.decoder.parameters() if p.requires_grad], "lr": h.lr}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": h.encoder_lr or h.lr})
        # The fused kernel updates all parameters in one pass (on the CPU about 6x faster than the
        # per-tensor loop at COCO sizes). Lightning's mixed-precision plugin refuses gradient
        # clipping with a fused optimizer, so bf16/16-mixed runs (and other devices) keep the default.
        mixed = self._trainer is not None and "mixed" in str(self._trainer.precision)
        fused = not mixed and all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
        return torch.optim.Adam(groups, lr=h.lr, weight_decay=h.weight_decay, fused=fused or None)

    # ------------------------------------------------------------------ forward passes
    def encode_images(self, images: Tensor) -> Tensor:
        """Annotation vectors (B, L, D) of images (B, 3, S, S) in [0, 1]."""
        if self.hparams.get("channels_last"):
            images = images.contiguous(memory_format=torch.channels_last)
        return self.encoder(images)

    def encode(self, batch: dict) -> Tensor:
        """Annotation vectors (B, L, D) from a batch's cached features or its images.

        A batch grouped by image (``image_index``: the image row of each caption) is encoded once
        per image, then each caption gets its image's vectors: (B_img, L, D) -> (N, L, D).
        """
        features = batch["features"].float() if "features" in batch else self.encode_images(batch["images"])
        if "image_index" in batch:
            features = features[batch["image_index"]]
        return features

    def on_fit_start(self) -> None:
        self._base_seed = torch.initial_seed()  # the run's seed (seed_everything), before any step

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Random draws (dropout, hard attention's samples) depend only on the run's seed and the
        # step, so that a run resumed from a checkpoint continues exactly as it would have.
        torch.manual_seed((self._base_seed + self.global_step) % 2**63)

    def training_step(self, batch: dict, batch_idx: int) -> Optional[Tensor]:
        h = self.hparams
        if batch["captions"].size(0) == 0:  # every image of the batch was unreadable (and skipped)
            return None
        # Running statistics (batch norm) change in the forward pass: keep them to undo a skipped step.
        saved_buffers = [b.clone() for b in self.buffers()] if h.nonfinite_loss == "skip" else None
        features = self.encode(batch)  # (B, L, D)
        captions, lengths = batch["captions"], batch["lengths"]
        if h.attention == "hard" and h.num_samples > 1:  # several location samples per caption
            features = features.repeat_interleave(h.num_samples, 0)
            captions = captions.repeat_interleave(h.num_samples, 0)
            lengths = lengths.repeat_interleave(h.num_samples, 0)
        B = captions.size(0)

        if h.attention == "hard":
            if h.semi_sampling_per == "image":  # the paper: a draw per image
                use_expected = torch.rand(B, device=self.device) < h.semi_sampling_p
            else:  # the authors' code: one draw per minibatch
                use_expected = (torch.rand((), device=self.device) < h.semi_sampling_p).expand(B)
            out = self.decoder(features, captions, lengths, mode="sample", use_expected=use_expected)
        else:
            out = self.decoder(features, captions, lengths)

        targets = captions[:, 1:]
        log_likelihood = caption_log_likelihood(out.logits, targets, out.mask)  # (B,)
        nll = -log_likelihood.mean()
        penalty = doubly_stochastic_penalty(out.alphas, out.mask).mean()
        loss = nll + h.doubly_stochastic * penalty
        tokens = out.mask.sum()
        metrics = {"train/nll_per_token": -log_likelihood.sum() / tokens, "train/attention_penalty": penalty}

        if h.attention == "hard":
            terms = reinforce_loss(
                log_likelihood, out.location_log_probs, out.entropies, out.mask, self.baseline,
                h.lambda_r, h.lambda_e, h.reward_per_step,
            )
            loss = loss + terms.loss
            metrics.update({
                "train/reward": terms.reward.mean(), "train/advantage": terms.advantage.mean(),
                "train/entropy": terms.entropy,
            })

        if not torch.isfinite(loss):
            message = f"non-finite loss ({loss.item()}) at global step {self.global_step} (epoch {self.current_epoch}, batch {batch_idx})"
            if h.nonfinite_loss == "skip":
                self._restore_buffers(saved_buffers)  # the forward pass must leave no trace either
                log.warning("%s: step skipped", message)
                self.log("train/skipped_steps", 1.0, reduce_fx="sum", on_step=False, on_epoch=True)
                return None
            raise CaptioningError(message + "; set --model.nonfinite_loss skip to skip such steps")
        if h.attention == "hard":
            self.baseline.copy_(update_baseline(self.baseline, terms.reward, h.baseline_decay))
            metrics["train/baseline"] = self.baseline.clone()
        self.log("train/loss", loss, prog_bar=True, batch_size=B)
        self.log_dict(metrics, batch_size=B)
        return loss

    def _restore_buffers(self, saved: list) -> None:
        with torch.no_grad():
            for buffer, value in zip(self.buffers(), saved):
                buffer.copy_(value)

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def generate(
        self,
        images: Optional[Tensor] = None,
        features: Optional[Tensor] = None,
        num_beams: int = 1,
        max_new_tokens: Optional[int] = None,
        attention_mode: Optional[str] = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        length_penalty: Optional[float] = None,
        generator: Optional[torch.Generator] = None,
    ) -> GenerationOutput:
        """Captions for images (B, 3, S, S) in [0, 1] or annotation vectors (B, L, D)."""
        if features is None:
            features = self.encode_images(images)
        v = self.vocab
        return generate(
            self.decoder, features, v.bos_id, v.eos_id, v.pad_id, num_beams,
            max_new_tokens or self.hparams.max_new_tokens, attention_mode or self.hparams.inference_attention,
            do_sample, temperature, top_k,
            self.hparams.length_penalty if length_penalty is None else length_penalty, generator,
        )

    def decode_text(self, sequences: Tensor) -> list[str]:
        return [self.vocab.decode_text(row) for row in sequences.tolist()]

    def _decode_step(self, batch: dict, num_beams: int) -> None:
        out = self.generate(features=self.encode(batch), num_beams=num_beams)
        seq = out.sequences.new_full((out.sequences.size(0), self.hparams.max_new_tokens), self.vocab.pad_id)
        seq[:, : out.sequences.size(1)] = out.sequences  # fixed width, so that ranks can be gathered
        self._predictions.append((batch["image_ids"].to(self.device), seq))

    def _gathered_predictions(self) -> dict[int, str]:
        """image_id -> caption over every rank; each image once (distributed samplers repeat some)."""
        width = self.hparams.max_new_tokens
        ids = torch.cat([i for i, _ in self._predictions]) if self._predictions else torch.zeros(0, dtype=torch.long, device=self.device)
        seqs = torch.cat([s for _, s in self._predictions]) if self._predictions else ids.new_zeros(0, width)
        self._predictions = []
        if self.trainer.world_size > 1:  # ranks may hold different counts: pad to the largest with id -1
            count = self.all_gather(torch.tensor(ids.numel(), device=self.device)).max().item()
            ids = torch.cat([ids, ids.new_full((count - ids.numel(),), -1)])
            seqs = torch.cat([seqs, seqs.new_zeros(count - seqs.size(0), width)])
            ids, seqs = self.all_gather(ids).flatten(0, 1), self.all_gather(seqs).flatten(0, 1)
            keep = ids >= 0
            ids, seqs = ids[keep], seqs[keep]
        return dict(zip(ids.tolist(), self.decode_text(seqs)))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._decode_step(batch, self.hparams.val_num_beams)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._decode_step(batch, self.hparams.test_num_beams)

    def _score(self, split: str, metrics: tuple) -> dict[str, float]:
        from captioning.data.shapes import parse_objects, record_objects
        from captioning.metrics import CocoScorer, object_f1

        predictions = self._gathered_predictions()
        if not predictions:
            return {}
        dm = self.trainer.datamodule
        references = {i: r for i, r in dm.references(split).items() if i in predictions}
        if self._scorer is None or self._scorer_metrics != metrics:
            self._scorer, self._scorer_metrics = CocoScorer(metrics=metrics), metrics
        scores = {k: v for k, v in self._scorer(references, predictions).items() if isinstance(v, float)}
        truth = {r.image_id: record_objects(r) for r in dm.records(split) if r.objects and r.image_id in predictions}
        if truth:
            scores["object_f1"] = object_f1({i: parse_objects(predictions[i]) for i in truth}, truth)["f1"]
        return scores

    def on_validation_epoch_end(self) -> None:
        for k, v in self._score("val", ("BLEU", "CIDEr")).items():
            self.log(f"val/{k}", v, prog_bar=k in ("CIDEr", "BLEU-4", "object_f1"))

    def on_test_epoch_end(self) -> None:
        for k, v in self._score("test", ("BLEU", "METEOR", "ROUGE_L", "CIDEr")).items():
            self.log(f"test/{k}", v)

    def teardown(self, stage: str) -> None:
        if self._scorer is not None and hasattr(self._scorer, "close"):
            self._scorer.close()
        self._scorer = None
