"""The LightningModule: wires a ShowAttendTell model, a training objective, a step strategy and the
evaluator to Lightning.

Everything else is a component it is given, or chooses once from its options: the model's
description (models/spec.py: ModelSpec, build_model), the objective (objectives/), the training
step (strategies.py: eager, static-shape or captured as CUDA graphs), per-step seeding, the
non-finite-loss guards and TF32 (guards.py), the optimizer (optim.py), the starting weights
(init_from.py), the decoding of validation and test and their scoring (evaluation/evaluator.py). The
checkpoint describes itself: these settings as plain values and the vocabulary are inside, so
storage/ rebuilds the model without running code.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Literal

import lightning as L
from torch import Tensor

from captioning.decoding.generation import GenerationConfig, recorded
from captioning.errors import ConfigError
from captioning.evaluation.evaluator import Evaluator
from captioning.evaluation.split_scores import known_training_captions, split_images
from captioning.fast import fast_model
from captioning.metrics.clip_score import ClipScoreConfig, ClipScoring
from captioning.models.encoders import EncoderConfig
from captioning.models.kinds import decoder_config
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.models.spec import ModelSpec, build_model
from captioning.objectives import Objective, objective_for
from captioning.training.guards import TF32, StepSeeding
from captioning.training.init_from import start_from
from captioning.training.optim import OptimizerConfig, configure_optimizers
from captioning.training.resume import check_checkpoint, checkpoint_extras
from captioning.training.schedules import recipe_callbacks
from captioning.training.strategies import step_strategy
from captioning.vocab import Vocabulary

log = logging.getLogger(__name__)


def split_evaluators(clip_score: ClipScoreConfig | None = None) -> dict[str, Evaluator]:
    """The scoring of each split, every registered metric's: validation picks the best checkpoint
    with those cheap enough for each epoch (no METEOR: no Java; metrics/ptb.py's tokens), test
    scores with all those chosen by default and Java's tokens. CLIPScore in test, and in validation
    when ``clip_score`` says so."""
    clip = ClipScoring.of(clip_score)
    return {
        "val": Evaluator(
            tokenizer="python", clip=clip if clip_score and clip_score.validation else None, validation=True
        ),
        "test": Evaluator(clip=clip),
    }


def encoder_grid(model: ShowAttendTell, image_size: int) -> tuple[int, int]:
    """(L, D) of the annotation vectors ``model``'s encoder makes of an image of ``image_size``
    (one blank image through it, in eval mode; each layer's mode is restored after)."""
    import torch

    encoder = model.encoder
    param = next(encoder.parameters(), None)
    modes = [(m, m.training) for m in encoder.modules()]  # frozen batch norms stay in eval mode
    try:
        encoder.eval()
        with torch.no_grad():
            blank = torch.zeros(1, 3, image_size, image_size, device=param.device if param is not None else "cpu")
            return tuple(encoder(blank).shape[1:])
    finally:
        for m, mode in modes:
            m.training = mode


class CaptioningModule(L.LightningModule):
    """Show, Attend and Tell with soft or hard attention (see the components' configs).

    Args:
        encoder: the image encoder.
        decoder: the decoder's settings: ``kind`` (models/kinds.py; "lstm", the paper's, by default)
            and that kind's fields (models/decoder.py: DecoderConfig; models/transformer.py:
            TransformerConfig). The LSTM's ``attention_kind`` chooses soft or hard attention.
        objective: the training objective (default: the paper's for the decoder's attention kind:
            CrossEntropy for soft, HardAttentionReinforce for hard).
        optimizer: Adam's settings, its learning-rate schedule and the weights' moving average.
        val_generation: decoding in validation (greedy by default).
        test_generation: decoding in ``captioning test`` (and the model's default elsewhere).
        nonfinite_loss: "error" stops at a NaN/inf loss, "skip" skips that step; both name the step.
        image_size: the side images are resized to; linked to ``data.image_size`` by the CLI and
            kept in the checkpoint, so that new images are resized the same way.
        init_from: a checkpoint to start from (e.g. cross-entropy weights before ``SCST``): its
            weights and vocabulary, a fresh optimizer and loop; its architecture must be this
            config's and its vocabulary the data's (a resumed run, ``--ckpt_path``, ignores it).
        static_shapes: train with the static-shape pass (strategies.py: StaticStep): captions padded
            to a length bucket, every row at every step, nothing read back to the host inside the
            pass; the same loss and gradients as the default pass, which is faster on a CPU.
        length_buckets: caption lengths in tokens (BOS and EOS included) the static-shape pass pads
            to; a longer batch keeps its own length.
        cuda_graphs: on a CUDA device, capture the static-shape step (forward, losses, backward,
            clipping) as one CUDA graph per (batch, bucket) shape, then Adam's fused step
            (strategies.py: CapturedStep; elsewhere it runs without capture). Implies static_shapes.
            Non-finite losses are counted on the device, read every 50 steps and before validation.
        tf32: TensorFloat-32 matmuls and convolutions on GPUs that have them.
        clip_score: CLIPScore and RefCLIPScore in ``captioning test`` (and validation, when it says
            so) with a CLIP model (metrics/clip_score.py); an evaluation setting, not kept in the checkpoint.
    """

    def __init__(
        self,
        encoder: EncoderConfig = EncoderConfig(),
        decoder: dict[str, Any] | None = None,
        objective: Objective | None = None,
        optimizer: OptimizerConfig = OptimizerConfig(),
        val_generation: GenerationConfig = GenerationConfig(num_beams=1),
        test_generation: GenerationConfig = GenerationConfig(num_beams=3),
        nonfinite_loss: Literal["error", "skip"] = "error",
        image_size: int = 224,
        init_from: str | None = None,
        static_shapes: bool = False,
        length_buckets: tuple[int, ...] = (16, 24, 32, 48, 64),
        cuda_graphs: bool = False,
        tf32: bool = True,
        clip_score: ClipScoreConfig | None = None,
    ):
        super().__init__()
        decoder = decoder_config(decoder)
        self.encoder_config, self.decoder_config, self.optimizer_config = encoder, decoder, optimizer
        self.val_generation, self.test_generation = val_generation, test_generation
        self.image_size, self.init_from, self.tf32 = image_size, init_from, tf32
        self.spec = ModelSpec(encoder, decoder, image_size, test_generation)  # the model's description
        self.objective = objective_for(decoder.attention_kind, objective)
        self.step_strategy = step_strategy(self.objective, nonfinite_loss, static_shapes, cuda_graphs, length_buckets)
        self.automatic_optimization = self.step_strategy.automatic_optimization
        self.save_hyperparameters(
            {  # plain values only: checkpoints load with weights_only=True
                "encoder": dataclasses.asdict(encoder),
                "decoder": dataclasses.asdict(decoder),
                "objective": self.objective.spec(),
                "optimizer": dataclasses.asdict(optimizer),
                "val_generation": recorded(val_generation),
                "test_generation": recorded(test_generation),
                "nonfinite_loss": nonfinite_loss,
                "image_size": image_size,
                "static_shapes": static_shapes,
                "length_buckets": list(length_buckets),
                "cuda_graphs": cuda_graphs,
                "tf32": tf32,
                **({"init_from": str(init_from)} if init_from is not None else {}),
            }
        )
        self.model: ShowAttendTell | None = None  # built once the vocabulary is known (set_vocab)
        self._fast: tuple = ()  # (fast_model(model),) once the model is built: not a submodule
        self.evaluators = split_evaluators(clip_score)

    @property
    def fast(self):
        """What the steps and the evaluators run: the model's fast twin (captioning/fast/), or the model."""
        return self._fast[0] if self._fast else None

    @property
    def vocab(self) -> Vocabulary | None:
        return self.model.vocab if self.model is not None else None

    def set_vocab(self, vocab: Vocabulary) -> None:
        """Build the model for ``vocab`` (once; the vocabulary must not change afterwards)."""
        if self.model is None:
            self.model = build_model(self.spec, vocab)
            self._fast = (fast_model(self.model),)
        elif vocab != self.model.vocab:
            raise ConfigError(
                f"the data's vocabulary ({len(vocab)} words) differs from the model's ({len(self.vocab)} words)"
            )

    def setup(self, stage: str) -> None:
        # The vocabulary is the model's if it has one (a checkpoint's), else the training data's.
        dm = self.trainer.datamodule
        if dm is None:
            if self.model is None:
                raise ConfigError("the model has no vocabulary: train it with a datamodule or load a checkpoint")
            return
        if self.model is None and self.init_from is not None and not self.trainer.ckpt_path:
            start_from(self, self.init_from, dm, stage)  # init_from.py: its weights and vocabulary, checked
        if self.model is not None:
            dm.set_vocab(self.vocab)
        dm.setup(stage)
        self.set_vocab(dm.vocab)
        if getattr(dm, "features", None) is not None:  # a cache of another grid: one line, not wrong inputs
            dm.feature_cache().check_grid(encoder_grid(self.model, self.image_size), "the model's encoder")
        known = known_training_captions(dm)  # for the share of novel captions
        for evaluator in self.evaluators.values():
            evaluator.set_training_captions(known=known)
        if stage == "fit":
            self.objective.setup(dm)  # e.g. SCST: the training references
            cut = dm.decoding_length_problem(  # captions longer than the model may write: once, when fitting starts
                {
                    f"model.{k}.max_new_tokens": getattr(self, k).max_new_tokens
                    for k in ("val_generation", "test_generation")
                }
            )
            if cut and self.trainer.is_global_zero:
                log.warning(cut)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint.update(checkpoint_extras(self))  # resume.py: the vocabulary, the run's settings, ...

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.set_vocab(Vocabulary.from_dict(checkpoint["vocabulary"]))
        check_checkpoint(self, checkpoint)  # the run's settings and the weights' shapes, in one line each
        if checkpoint.get("objective_state"):
            self.objective.load_checkpoint_state(checkpoint["objective_state"])

    def configure_optimizers(self):
        return configure_optimizers(self, self.optimizer_config)

    def configure_callbacks(self) -> list:
        return [
            StepSeeding(),
            *([TF32()] if self.tf32 else []),
            *self.step_strategy.callbacks(),
            *recipe_callbacks(self),
        ]

    # ------------------------------------------------------------------ training, validation and test
    def training_step(self, batch: dict, batch_idx: int) -> Tensor | None:
        if batch["captions"].size(0) == 0:  # every image of the batch was unreadable (and skipped)
            return None
        out = self.step_strategy(self, batch, batch_idx)
        if out is None:  # a skipped step
            return None
        logs = {**out.logs, **self.objective.commit(out), "lr": self.optimizers().param_groups[0]["lr"]}
        self.log("train/loss", out.loss, prog_bar=True, batch_size=out.batch_size)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=out.batch_size)
        return out.loss if self.automatic_optimization else None

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluators["val"].add(self.fast, batch, self.val_generation)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluators["test"].add(self.fast, batch, self.test_generation)

    def _score(self, split: str) -> dict[str, float]:
        evaluator, dm = self.evaluators[split], self.trainer.datamodule
        predictions = evaluator.predictions(self.vocab, self.all_gather if self.trainer.world_size > 1 else None)
        scores, _ = evaluator.score(
            predictions,
            dm.references(split),
            dm,
            split,
            images=split_images(dm, split),
            warn=not self.trainer.sanity_checking and self.global_step > 0,  # no alarms about untrained weights
        )
        return {k: v for k, v in scores.items() if isinstance(v, float)}

    def on_validation_epoch_end(self) -> None:
        for k, v in self._score("val").items():
            self.log(f"val/{k}", v, prog_bar=k in ("CIDEr", "BLEU-4", "object_f1"))

    def on_test_epoch_end(self) -> None:
        for k, v in self._score("test").items():
            self.log(f"test/{k}", v)

    def teardown(self, stage: str) -> None:
        for evaluator in self.evaluators.values():
            evaluator.close()
