"""How a training step runs, chosen once from the config (:func:`step_strategy`):

* :class:`EagerStep` (default): the objective on the shrinking-batch pass (captions sorted by
  length, the rows still running at each step); Lightning runs backward, clipping and Adam.
* :class:`StaticStep` (``model.static_shapes``): captions padded to the smallest length bucket
  that holds them and the decoder's static-shape pass (every row at every step, masked losses,
  nothing read back to the host inside the pass): the same loss and gradients.
* :class:`CapturedStep` (``model.cuda_graphs``): the static step's forward, losses, backward and
  clipping captured as one CUDA graph per (batch, bucket) shape and replayed (captured_step.py);
  it steps the optimizer itself (manual optimisation). Elsewhere (a CPU, several DDP processes)
  the same code runs without capture.

Each takes the LightningModule and a batch and returns the objective's output (None: no step), with
the loss checked by a non-finite guard (guards.py).
"""

from __future__ import annotations

import logging

import torch.nn.functional as F
from torch import Tensor

from captioning.errors import ConfigError
from captioning.objectives import Objective, ObjectiveOutput
from captioning.training.guards import NonFiniteCount, NonFiniteLoss
from captioning.vocab import Vocabulary

log = logging.getLogger(__name__)


class EagerStep:
    """The objective's loss on the default (shrinking-batch) teacher-forced pass."""

    #: Lightning runs backward, clipping and the optimizer step
    automatic_optimization = True
    #: the decoder's static-shape pass
    static = False

    def __init__(self, objective: Objective, guard: NonFiniteLoss):
        self.objective, self.guard = objective, guard

    def callbacks(self) -> list:
        """The Lightning callbacks this step needs."""
        return []

    def __call__(self, module, batch: dict, batch_idx: int) -> ObjectiveOutput | None:
        model = module.fast  # the model's fast twin where it has one (captioning/fast/)
        return self.guard(
            module, batch_idx, lambda: self.objective(model, model.features(batch), batch, static=self.static)
        )


class StaticStep(EagerStep):
    """The static-shape pass over captions padded to ``length_buckets`` (lengths in tokens, BOS and
    EOS included; a longer batch keeps its own length)."""

    static = True

    def __init__(self, objective: Objective, guard: NonFiniteLoss, length_buckets: tuple[int, ...]):
        super().__init__(objective, guard)
        self.length_buckets = tuple(sorted(length_buckets))

    def bucketed(self, captions: Tensor) -> Tensor:
        """Captions (B, T + 1) padded with PAD to the smallest length bucket that holds them."""
        width = captions.size(1)
        target = next((n for n in self.length_buckets if n >= width), width)
        return F.pad(captions, (0, target - width), value=Vocabulary.pad_id) if target > width else captions

    def __call__(self, module, batch: dict, batch_idx: int) -> ObjectiveOutput | None:
        return super().__call__(module, {**batch, "captions": self.bucketed(batch["captions"])}, batch_idx)


class CapturedStep(StaticStep):
    """The static step captured as CUDA graphs (training/captured_step.py), then Adam's step.

    ``clip_val``: the gradient clipping inside the captured step (the CLI moves
    ``trainer.gradient_clip_val`` here: Lightning clips only in automatic optimisation). Non-finite
    losses are counted on the device and read every ``check_every`` steps (:class:`NonFiniteCount`).
    """

    automatic_optimization = False

    def __init__(self, objective: Objective, length_buckets: tuple[int, ...], check_every: int = 50):
        super().__init__(objective, None, length_buckets)
        self.clip_val: float | None = None
        self.graphs = None  # the GraphedTrainingStep, built at the first step (on the fit's device)
        self.nonfinite = NonFiniteCount(check_every)

    def callbacks(self) -> list:
        return [self.nonfinite]

    def _build(self, module):
        from captioning.cuda_graphs import graphs_available
        from captioning.training.captured_step import GraphedTrainingStep

        if str(module.trainer.precision) in ("16-mixed", "16"):
            raise ConfigError(
                "model.cuda_graphs: float16 mixed precision needs its loss scaler outside the "
                "captured step; use --trainer.precision bf16-mixed or 32-true"
            )
        capture = graphs_available(module.device) and module.trainer.world_size == 1
        if not capture:
            reason = "not a CUDA device" if not graphs_available(module.device) else "several processes (DDP)"
            log.info("model.cuda_graphs: %s; the static-shape step runs without capture", reason)
        model = module.fast  # the model's fast twin where it has one (captioning/fast/)
        encode = lambda x, b: model.features({**b, ("features" if x.dim() == 3 else "images"): x})  # noqa: E731
        params = [p for p in module.parameters() if p.requires_grad]
        return GraphedTrainingStep(model, self.objective, params, self.clip_val, capture, encode)

    def __call__(self, module, batch: dict, batch_idx: int) -> ObjectiveOutput:
        if self.graphs is None:
            self.graphs = self._build(module)
        captions = self.bucketed(batch["captions"])
        inputs = batch["features"] if "features" in batch else batch["images"]
        loss, logs, state, finite = self.graphs(
            inputs, captions, batch["lengths"], *([batch["image_index"]] if "image_index" in batch else [])
        )
        module.optimizers().step()
        self.nonfinite.add(finite)
        # the graph's outputs are overwritten by its next replay: what is logged is copied
        return ObjectiveOutput(loss.clone(), captions.size(0), {k: v.clone() for k, v in logs.items()}, state)


def step_strategy(
    objective: Objective, nonfinite_loss: str, static_shapes: bool, cuda_graphs: bool, length_buckets: tuple[int, ...]
) -> EagerStep:
    """The step of a config's options (``cuda_graphs`` implies ``static_shapes``); a one-line
    ConfigError for a bad option, or if the objective's step cannot be captured."""
    if nonfinite_loss not in ("error", "skip"):
        raise ConfigError(f"model.nonfinite_loss: expected 'error' or 'skip', got {nonfinite_loss!r}")
    if any(not isinstance(n, int) or n < 2 for n in length_buckets):
        raise ConfigError(
            f"model.length_buckets: expected caption lengths (integers >= 2), got {list(length_buckets)!r}"
        )
    if cuda_graphs:
        problem = objective.static_step_problem() or (
            "nonfinite_loss skip needs the loss on the host at every step" if nonfinite_loss == "skip" else None
        )
        if problem:
            raise ConfigError(f"model.cuda_graphs: the step cannot be captured: {problem}; train without cuda_graphs")
        return CapturedStep(objective, length_buckets)
    guard = NonFiniteLoss(nonfinite_loss)
    return StaticStep(objective, guard, length_buckets) if static_shapes else EagerStep(objective, guard)
