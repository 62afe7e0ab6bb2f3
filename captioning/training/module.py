"""The LightningModule: wires a ShowAttendTell model, a training objective and the evaluator to Lightning.

Everything else is a component it is given: the encoder and decoder configs (models/), the
objective (objectives/), the generation settings of validation and test (models/search.py) and
the scoring (evaluation.py). The checkpoint describes itself: these settings as plain values and
the vocabulary are inside, so checkpoint.py rebuilds the model without running code.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Literal, Optional

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.errors import CaptioningError, CheckpointError, ConfigError
from captioning.decoding.evaluator import Evaluator
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.decoding.search import GenerationConfig, bad_ending_ids
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.objectives import Objective, objective_for
from captioning.training.optim import OptimizerConfig, build_optimizer
from captioning.vocab import Vocabulary

log = logging.getLogger(__name__)


def step_seed(run_seed: int, step: int, rank: int) -> int:
    """The seed of one training step on one process: each rank draws its own dropout masks and
    hard-attention samples, and a run resumed at ``step`` draws what it would have drawn."""
    return int(np.random.SeedSequence([run_seed, step, rank]).generate_state(1, np.uint64)[0] % 2**63)


#: what the weights' meaning depends on (dropout, pretrained, fine_tune_blocks... may change)
_ARCHITECTURE = {"encoder": ("name", "grid_size", "channels", "dim"),
                 "decoder": ("embed_dim", "hidden_dim", "attention_dim", "attention_kind", "prev2out", "ctx2out")}


def initial_weights(path: str, hparams: dict) -> tuple[Vocabulary, dict]:
    """(vocabulary, the model's weights) of the checkpoint or model folder a run starts from (``model.init_from``);
    one line of :class:`CheckpointError` if it is not a checkpoint of ``hparams``' architecture."""
    from captioning.storage.folder_json import looks_like_hub_id
    from captioning.storage.folder import read_checkpoint

    if not os.path.exists(path) and not looks_like_hub_id(path):
        raise CheckpointError(f"model.init_from={path}: no such file")
    try:
        ckpt = read_checkpoint(path)  # a checkpoint file or a model folder (captioning export)
    except CheckpointError as err:
        raise CheckpointError(f"model.init_from={path}: not a captioning checkpoint ({err})") from None
    theirs, plain = ckpt["hyper_parameters"], lambda v: list(v) if isinstance(v, tuple) else v
    if not all(isinstance(theirs.get(group), dict) for group in _ARCHITECTURE):
        raise CheckpointError(f"model.init_from={path}: a checkpoint of an older version of this code (no encoder/decoder settings)")
    differences = [f"{group}.{key} is {theirs[group].get(key)!r} there, {hparams[group][key]!r} here"
                   for group, keys in _ARCHITECTURE.items() for key in keys
                   if plain(theirs[group].get(key)) != plain(hparams[group][key])]
    differences += [f"image_size is {theirs['image_size']!r} there, {hparams['image_size']!r} here"] * (theirs["image_size"] != hparams["image_size"])
    if differences:
        raise CheckpointError(f"model.init_from={path}: another architecture ({'; '.join(differences)}); "
                              "start from a checkpoint of this config's model, or make the config match it")
    weights = {k[len("model."):]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    return Vocabulary.from_dict(ckpt["vocabulary"]), weights


class CaptioningModule(L.LightningModule):
    """Show, Attend and Tell with soft or hard attention (see the components' configs).

    Args:
        encoder: the image encoder.
        decoder: the attention LSTM decoder; ``attention_kind`` chooses soft or hard attention.
        objective: the training objective (default: the paper's for the decoder's attention kind:
            CrossEntropy for soft, HardAttentionReinforce for hard).
        optimizer: Adam's settings.
        val_generation: decoding in validation (greedy by default).
        test_generation: decoding in ``captioning test`` (and the model's default elsewhere).
        nonfinite_loss: "error" stops at a NaN/inf loss, "skip" skips that step; both name the step.
        image_size: the side images are resized to; linked to ``data.image_size`` by the CLI and
            kept in the checkpoint, so that new images are resized the same way.
        init_from: a checkpoint to start from (e.g. cross-entropy weights before ``SCST``): its
            weights and vocabulary, a fresh optimizer and loop; its architecture must be this
            config's and its vocabulary the data's (a resumed run, ``--ckpt_path``, ignores it).
        static_shapes: train with the static-shape pass (models/decoder.py: static_forward):
            captions padded to the smallest of ``length_buckets`` that holds them, every row at
            every step, masked losses, nothing read back to the host inside the pass. The same loss
            and gradients as the default shrinking-batch pass, which is faster on a CPU.
        length_buckets: caption lengths in tokens (BOS and EOS included) the static-shape pass pads
            to; a longer batch keeps its own length.
        cuda_graphs: on a CUDA device, capture the training step (the static-shape pass, the losses,
            backward and gradient clipping) as one CUDA graph per (batch, bucket) shape and replay
            it; Adam's fused step follows. Implies ``static_shapes``. Elsewhere the same step runs
            without capture. The non-finite-loss check is made on the device and read every
            ``nonfinite_check_every`` steps (and before each validation).
        tf32: on GPUs that have them, TensorFloat-32 matmuls and convolutions (float32 storage,
            10-bit mantissa products).
    """

    def __init__(
        self,
        encoder: EncoderConfig = EncoderConfig(),
        decoder: DecoderConfig = DecoderConfig(),
        objective: Optional[Objective] = None,
        optimizer: OptimizerConfig = OptimizerConfig(),
        val_generation: GenerationConfig = GenerationConfig(num_beams=1),
        test_generation: GenerationConfig = GenerationConfig(num_beams=3),
        nonfinite_loss: Literal["error", "skip"] = "error",
        image_size: int = 224,
        init_from: Optional[str] = None,
        static_shapes: bool = False,
        length_buckets: tuple[int, ...] = (16, 24, 32, 48, 64),
        cuda_graphs: bool = False,
        tf32: bool = True,
    ):
        super().__init__()
        if nonfinite_loss not in ("error", "skip"):
            raise ConfigError(f"model.nonfinite_loss: expected 'error' or 'skip', got {nonfinite_loss!r}")
        if any(not isinstance(n, int) or n < 2 for n in length_buckets):
            raise ConfigError(f"model.length_buckets: expected caption lengths (integers >= 2), got {list(length_buckets)!r}")
        self.static_shapes = bool(static_shapes or cuda_graphs)
        self.length_buckets, self.cuda_graphs, self.tf32 = tuple(sorted(length_buckets)), bool(cuda_graphs), bool(tf32)
        self.encoder_config, self.decoder_config, self.optimizer_config = encoder, decoder, optimizer
        self.val_generation, self.test_generation = val_generation, test_generation
        self.nonfinite_loss, self.image_size, self.init_from = nonfinite_loss, image_size, init_from
        self.objective = objective_for(decoder.attention_kind, objective)
        if cuda_graphs:
            problem = self.objective.static_step_problem() or \
                ("nonfinite_loss skip needs the loss on the host at every step" if nonfinite_loss == "skip" else None)
            if problem:
                raise ConfigError(f"model.cuda_graphs: the step cannot be captured: {problem}; train without cuda_graphs")
        #: gradient clipping inside the captured step (the CLI moves trainer.gradient_clip_val here:
        #: Lightning clips only in automatic optimisation)
        self.graph_clip_val: Optional[float] = None
        self._graphs = None
        self._nonfinite_steps = None
        self.save_hyperparameters({  # plain values only: checkpoints load with weights_only=True
            "encoder": dataclasses.asdict(encoder), "decoder": dataclasses.asdict(decoder),
            "objective": self.objective.spec(), "optimizer": dataclasses.asdict(optimizer),
            "val_generation": dataclasses.asdict(val_generation), "test_generation": dataclasses.asdict(test_generation),
            "nonfinite_loss": nonfinite_loss, "image_size": image_size,
            "static_shapes": static_shapes, "length_buckets": list(length_buckets), "cuda_graphs": cuda_graphs, "tf32": tf32,
            **({"init_from": str(init_from)} if init_from is not None else {}),
        })
        self.model: Optional[ShowAttendTell] = None  # built once the vocabulary is known (set_vocab)
        # Validation scores what picks the best checkpoint (no Java process beyond the tokenizer's).
        self.evaluators = {"val": Evaluator(("BLEU", "CIDEr")), "test": Evaluator(("BLEU", "METEOR", "ROUGE_L", "CIDEr"))}

    @property
    def vocab(self) -> Optional[Vocabulary]:
        return self.model.vocab if self.model is not None else None

    def set_vocab(self, vocab: Vocabulary) -> None:
        """Build the model for ``vocab`` (once; the vocabulary must not change afterwards)."""
        if self.model is None:
            self.model = ShowAttendTell(self.encoder_config, self.decoder_config, vocab)
            self.model.decoder.bad_ending_ids = bad_ending_ids(vocab)  # for GenerationConfig.forbid_bad_endings
        elif vocab != self.model.vocab:
            raise ConfigError(f"the data's vocabulary ({len(vocab)} words) differs from the model's ({len(self.vocab)} words)")

    def setup(self, stage: str) -> None:
        # The vocabulary is the model's if it has one (a checkpoint's), else the training data's.
        dm = self.trainer.datamodule
        if dm is None:
            if self.model is None:
                raise ConfigError("the model has no vocabulary: train it with a datamodule or load a checkpoint")
            return
        if self.model is None and self.init_from is not None and not self.trainer.ckpt_path:
            vocab, weights = initial_weights(self.init_from, self.hparams)
            dm.setup(stage)  # the data's own vocabulary, to compare
            if dm.vocab != vocab:
                raise ConfigError(f"model.init_from={self.init_from}: its vocabulary ({len(vocab)} words) is not the "
                                  f"data's ({len(dm.vocab)} words); train on the data it was trained on, with the same "
                                  "data.min_word_freq / data.vocabulary")
            self.set_vocab(vocab)
            self.model.load_state_dict(weights)
        if self.model is not None:
            dm.set_vocab(self.vocab)
        dm.setup(stage)
        self.set_vocab(dm.vocab)
        if stage == "fit" and hasattr(self.objective, "setup"):  # e.g. SCST: the training references
            self.objective.setup(dm)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["vocabulary"] = self.vocab.to_dict()
        dm = self.trainer.datamodule
        checkpoint["training_data"] = str(getattr(dm, "annotations", "")) or None  # for the model's description
        if hasattr(self.objective, "checkpoint_state"):  # e.g. SCST's CIDEr-D document frequencies
            checkpoint["objective_state"] = self.objective.checkpoint_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.set_vocab(Vocabulary.from_dict(checkpoint["vocabulary"]))
        if checkpoint.get("objective_state") and hasattr(self.objective, "load_checkpoint_state"):
            self.objective.load_checkpoint_state(checkpoint["objective_state"])

    def configure_optimizers(self):
        return build_optimizer(self.model, self.optimizer_config, "mixed" in str(self.trainer.precision))

    # ------------------------------------------------------------------ training
    @property
    def automatic_optimization(self) -> bool:
        # the captured step runs backward and clipping itself; Adam is stepped after it
        return self._automatic_optimization and not self.cuda_graphs

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self._automatic_optimization = value

    def on_fit_start(self) -> None:
        self._run_seed = torch.initial_seed()  # the run's seed (seed_everything), before any step
        if self.tf32 and self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def on_train_start(self) -> None:
        self.model.decoder.static_shapes = self.static_shapes

    def on_train_end(self) -> None:
        self.model.decoder.static_shapes = False
        self._check_finite()

    def bucketed(self, captions: Tensor) -> Tensor:
        """Captions (B, T + 1) padded with PAD to the smallest length bucket that holds them."""
        width = captions.size(1)
        target = next((n for n in self.length_buckets if n >= width), width)
        return F.pad(captions, (0, target - width), value=Vocabulary.pad_id) if target > width else captions

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        # Dropout and hard attention draw from the global generator: seed it per step and rank.
        torch.manual_seed(step_seed(self._run_seed, self.global_step, self.global_rank))

    def training_step(self, batch: dict, batch_idx: int) -> Optional[Tensor]:
        if batch["captions"].size(0) == 0:  # every image of the batch was unreadable (and skipped)
            return None
        if self.static_shapes:
            batch = {**batch, "captions": self.bucketed(batch["captions"])}
        if self.cuda_graphs:
            return self._graphed_training_step(batch)
        # Running statistics (batch norm) change in the forward pass: keep them to undo a skipped step.
        saved = [b.clone() for b in self.buffers()] if self.nonfinite_loss == "skip" else None
        out = self.objective(self.model, self.model.features(batch), batch)
        if not torch.isfinite(out.loss):
            message = f"non-finite loss ({out.loss.item()}) at global step {self.global_step} (epoch {self.current_epoch}, batch {batch_idx})"
            if saved is None:
                raise CaptioningError(message + "; set --model.nonfinite_loss skip to skip such steps")
            with torch.no_grad():  # the forward pass must leave no trace either
                for buffer, value in zip(self.buffers(), saved):
                    buffer.copy_(value)
            log.warning("%s: step skipped", message)
            self.log("train/skipped_steps", 1.0, reduce_fx="sum", on_step=False, on_epoch=True)
            return None
        logs = {**out.logs, **self.objective.commit(out)}
        self.log("train/loss", out.loss, prog_bar=True, batch_size=out.batch_size)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=out.batch_size)
        return out.loss

    # ------------------------------------------------------------------ the captured step
    #: how often (in steps) the captured step's non-finite-loss count is read back
    nonfinite_check_every = 50

    def _graphed_training_step(self, batch: dict) -> None:
        from captioning.cuda_graphs import graphs_available
        from captioning.training.captured_step import GraphedTrainingStep
        from captioning.objectives import ObjectiveOutput

        if self._graphs is None:
            if str(self.trainer.precision) in ("16-mixed", "16"):
                raise ConfigError("model.cuda_graphs: float16 mixed precision needs its loss scaler outside the "
                                  "captured step; use --trainer.precision bf16-mixed or 32-true")
            capture = graphs_available(self.device) and self.trainer.world_size == 1
            if not capture:
                reason = "not a CUDA device" if not graphs_available(self.device) else "several processes (DDP)"
                log.info("model.cuda_graphs: %s; the static-shape step runs without capture", reason)
            encode = lambda x, b: self.model.features({**b, ("features" if x.dim() == 3 else "images"): x})  # noqa: E731
            self._graphs = GraphedTrainingStep(self.model, self.objective, [p for p in self.parameters() if p.requires_grad],
                                               self.graph_clip_val, capture, encode)
        inputs = batch["features"] if "features" in batch else batch["images"]
        loss, logs, state, finite = self._graphs(inputs, batch["captions"], batch["lengths"],
                                                 *([batch["image_index"]] if "image_index" in batch else []))
        self.optimizers().step()
        bad = (~finite).int()
        self._nonfinite_steps = bad if self._nonfinite_steps is None else self._nonfinite_steps + bad
        if (self.global_step % self.nonfinite_check_every) == 0:
            self._check_finite()
        out = ObjectiveOutput(loss, batch["captions"].size(0), logs, state)
        logs = {**{k: v.clone() for k, v in logs.items()}, **self.objective.commit(out)}
        self.log("train/loss", loss.clone(), prog_bar=True, batch_size=out.batch_size)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, batch_size=out.batch_size)

    def _check_finite(self) -> None:
        """Read the captured steps' count of non-finite losses (one host read); stop if any."""
        if self._nonfinite_steps is not None and int(self._nonfinite_steps) > 0:
            raise CaptioningError(f"non-finite loss in {int(self._nonfinite_steps)} step(s) at or before global step "
                                  f"{self.global_step} (epoch {self.current_epoch}); the weights after them are not "
                                  "usable: resume from the last checkpoint with a lower learning rate, or train without "
                                  "model.cuda_graphs and with --model.nonfinite_loss skip")

    def on_validation_start(self) -> None:
        self._check_finite()  # before a checkpoint could keep weights a non-finite step made

    # ------------------------------------------------------------------ validation and test
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluators["val"].add(self.model, batch, self.val_generation)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.evaluators["test"].add(self.model, batch, self.test_generation)

    def _score(self, split: str) -> dict[str, float]:
        evaluator, dm = self.evaluators[split], self.trainer.datamodule
        predictions = evaluator.predictions(self.vocab, self.all_gather if self.trainer.world_size > 1 else None)
        scores, _ = evaluator.score(predictions, dm.references(split), lambda p, a: dm.dataset_scores(split, p, a))
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
