"""What every training objective is: (model, annotation vectors, batch) -> loss and logged values.

A new objective is a subclass in a file of its own, registered where it is defined::

    @OBJECTIVES.register("my_objective")
    class MyObjective(Objective): ...

and imported by objectives/__init__.py (a user's own registers when the user's module is imported,
e.g. by a config's ``class_path``). The LightningModule only calls the methods declared here.
Objectives are ``nn.Module``s so that running state (e.g. a REINFORCE baseline) is saved in
checkpoints with the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from captioning.registry import Registry


@dataclass
class ObjectiveOutput:
    loss: Tensor  # scalar to minimise
    batch_size: int  # captions the loss averages over (for logging)
    logs: dict[str, Tensor] = field(default_factory=dict)  # logged as train/<name>
    state: dict[str, Tensor] = field(default_factory=dict)  # what commit() needs from the step


class Objective(nn.Module):
    """Base class. Subclasses pass their settings to ``__init__`` by keyword: they are kept in
    :attr:`settings` (plain values) so that a checkpoint can rebuild the objective (:meth:`spec`).

    The hooks below (``setup``, ``start_epoch``, ``commit``, ``checkpoint_state``,
    ``load_checkpoint_state``) do nothing by default; the LightningModule and its callbacks call
    every one of them for every objective.
    """

    #: the decoders' attention kinds this objective can train
    attention_kinds: tuple[str, ...] = ("soft", "hard")
    #: names of buffers a checkpoint may lack, size otherwise or hold in excess (e.g. running state
    #: added by a later version): checkpoint checks skip them, and the objective's own
    #: ``_load_from_state_dict`` fills them in or drops them
    optional_state: tuple[str, ...] = ()

    def __init__(self, **settings):
        super().__init__()
        self.settings = dict(settings)

    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        """The loss of one batch. model: a ShowAttendTell; features: (B, L, D); batch: captions, lengths...;
        ``static``: teacher forcing by the decoder's static-shape pass (``model(..., static=True)``:
        every row at every step, nothing read back to the host; the training module's static and
        captured steps ask for it)."""
        raise NotImplementedError

    def static_step_problem(self) -> str | None:
        """Why this objective's step cannot be captured as a CUDA graph (``model.cuda_graphs``), or
        None: the step must read nothing back to the host and launch the same kernels every time."""
        return None

    def setup(self, datamodule) -> None:
        """Called once the training data is set up, before fitting (e.g. SCST reads the training references)."""

    def start_epoch(self, epoch: int) -> None:
        """Called when each training epoch starts (0-based; e.g. scheduled sampling's clock)."""

    def commit(self, output: ObjectiveOutput) -> dict[str, Tensor]:
        """Update running state once a step's loss was found finite; returns more values to log."""
        return {}

    def checkpoint_state(self) -> dict:
        """State a checkpoint keeps besides the buffers (plain values and tensors; {}: none), given
        back to :meth:`load_checkpoint_state` when the checkpoint is loaded."""
        return {}

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore what :meth:`checkpoint_state` returned (called only with a non-empty state)."""

    def spec(self) -> dict:
        """{"class_path", "init_args"}: the objective as a config entry (and in checkpoints)."""
        return {"class_path": f"{type(self).__module__}.{type(self).__name__}", "init_args": dict(self.settings)}


#: the objectives a config or checkpoint may name, each registered beside its class (nothing else is
#: imported from a checkpoint): a ``class_path`` names one by its registered name or its class's name
OBJECTIVES: Registry[type[Objective]] = Registry("objective", field="model.objective")
