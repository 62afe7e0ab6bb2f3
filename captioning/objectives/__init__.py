"""Training objectives: each a class with one method from (model, features, batch) to the loss.

* ``cross_entropy``, :class:`CrossEntropy`: soft attention (NLL + doubly stochastic attention).
* ``reinforce``, :class:`HardAttentionReinforce`: hard attention (NLL through sampled locations + REINFORCE).
* ``gumbel``, :class:`HardAttentionGumbel`: hard attention by straight-through Gumbel-softmax (not the
  paper's; ``HardAttentionReinforce`` with ``estimator: gumbel`` is its earlier spelling: see current_spelling).
* ``scst``, :class:`SCST`: self-critical sequence training (CIDEr-D rewards), soft or hard, after cross-entropy.

Each registers itself in :data:`OBJECTIVES` (base.py) beside its class; importing this package
imports them all. Configs name one as ``model.objective`` (``class_path`` + ``init_args``); without
one the decoder's attention kind picks its paper objective. A new objective is a new file here
(imported below), or a user's module a config's ``class_path`` imports.
"""

from __future__ import annotations

import inspect

from captioning.compat import objective_spelling
from captioning.errors import ConfigError
from captioning.objectives.base import OBJECTIVES, Objective, ObjectiveOutput
from captioning.objectives.cross_entropy import CrossEntropy
from captioning.objectives.gumbel import HardAttentionGumbel
from captioning.objectives.hard import HardAttentionObjective
from captioning.objectives.reinforce import HardAttentionReinforce
from captioning.objectives.scst import SCST


def list_objectives() -> list[str]:
    """The registered objectives' names, in registration order (the built-in ones: cross_entropy, gumbel,
    reinforce, scst)."""
    return OBJECTIVES.names()


def objective_class(class_path: str) -> type[Objective]:
    """The registered objective a config's or checkpoint's ``class_path`` names: its last part is a
    registered name (``scst``) or the name of a registered class (``captioning.objectives.SCST``,
    ``captioning.objectives.scst.SCST``). Nothing else is imported. A one-line ConfigError naming
    the registered objectives otherwise."""
    name = str(class_path).rsplit(".", 1)[-1]
    if name in OBJECTIVES:
        return OBJECTIVES.get(name)
    by_class = {OBJECTIVES.get(key).__name__: OBJECTIVES.get(key) for key in OBJECTIVES}
    if name in by_class:
        return by_class[name]
    raise OBJECTIVES.unknown(class_path, extra=f"a class_path ending in one of their classes ({', '.join(by_class)})")


def objective_for(attention_kind: str, objective: Objective | None = None) -> Objective:
    """``objective``, checked against the decoder's attention kind, or that kind's paper objective."""
    if objective is None:
        return HardAttentionReinforce() if attention_kind == "hard" else CrossEntropy()
    if attention_kind not in objective.attention_kinds:
        raise ConfigError(
            f"model.objective: {type(objective).__name__} does not train {attention_kind} attention "
            f"(it trains {' or '.join(objective.attention_kinds)}); change model.objective or model.decoder.attention_kind"
        )
    return objective


def current_spelling(class_path: str, init_args: dict) -> tuple[str, dict]:
    """(class_path, init_args) of an objective entry in this version's spelling: the Gumbel
    objective's earlier spelling is read as :func:`captioning.compat.objective_spelling` says, with the
    settings HardAttentionGumbel takes. Checkpoints (:func:`objective_from_spec`) and configs
    (training/cli.py) are read through it."""
    shared = {
        name
        for cls in (HardAttentionGumbel, HardAttentionObjective)
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    }
    return objective_spelling(class_path, init_args, shared)


def objective_from_spec(spec: dict) -> Objective:
    """The objective of a {"class_path", "init_args"} entry (a checkpoint's), from OBJECTIVES only
    (:func:`objective_class`)."""
    class_path, init_args = current_spelling(str(spec.get("class_path", "")), dict(spec.get("init_args") or {}))
    return objective_class(class_path)(**init_args)


__all__ = [
    "Objective",
    "ObjectiveOutput",
    "CrossEntropy",
    "HardAttentionReinforce",
    "HardAttentionGumbel",
    "SCST",
    "OBJECTIVES",
    "list_objectives",
    "objective_class",
    "objective_for",
    "objective_from_spec",
    "current_spelling",
]
