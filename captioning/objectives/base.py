"""What every training objective is: (model, annotation vectors, batch) -> loss and logged values.

A new objective is a subclass in a file of its own (registered in objectives/__init__.py); the
LightningModule only calls it. Objectives are ``nn.Module``s so that running state (e.g. a
REINFORCE baseline) is saved in checkpoints with the weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from typing import Optional

from torch import Tensor, nn


@dataclass
class ObjectiveOutput:
    loss: Tensor  # scalar to minimise
    batch_size: int  # captions the loss averages over (for logging)
    logs: dict[str, Tensor] = field(default_factory=dict)  # logged as train/<name>
    state: dict[str, Tensor] = field(default_factory=dict)  # what commit() needs from the step


class Objective(nn.Module):
    """Base class. Subclasses pass their settings to ``__init__`` by keyword: they are kept in
    :attr:`settings` (plain values) so that a checkpoint can rebuild the objective (:meth:`spec`)."""

    #: the decoders' attention kinds this objective can train
    attention_kinds: tuple[str, ...] = ("soft", "hard")

    def __init__(self, **settings):
        super().__init__()
        self.settings = dict(settings)

    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        """The loss of one batch. model: a ShowAttendTell; features: (B, L, D); batch: captions, lengths...;
        ``static``: teacher forcing by the decoder's static-shape pass (``model(..., static=True)``:
        every row at every step, nothing read back to the host; the training module's static and
        captured steps ask for it)."""
        raise NotImplementedError

    def static_step_problem(self) -> Optional[str]:
        """Why this objective's step cannot be captured as a CUDA graph (``model.cuda_graphs``), or
        None: the step must read nothing back to the host and launch the same kernels every time."""
        return None

    def commit(self, output: ObjectiveOutput) -> dict[str, Tensor]:
        """Update running state once a step's loss was found finite; returns more values to log."""
        return {}

    def spec(self) -> dict:
        """{"class_path", "init_args"}: the objective as a config entry (and in checkpoints)."""
        return {"class_path": f"{type(self).__module__}.{type(self).__name__}", "init_args": dict(self.settings)}
