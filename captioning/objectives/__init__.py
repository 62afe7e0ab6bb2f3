"""Training objectives: each a class with one method from (model, features, batch) to the loss.

* :class:`CrossEntropy`: soft attention (NLL + doubly stochastic attention).
* :class:`HardAttentionReinforce`: hard attention (NLL through sampled locations + REINFORCE).
* :class:`SCST`: self-critical sequence training (CIDEr-D rewards), soft or hard, after cross-entropy.

Configs name one as ``model.objective`` (``class_path`` + ``init_args``); without one the decoder's
attention kind picks its paper objective. A new objective is a new file here, added to OBJECTIVES.
"""
from __future__ import annotations

from typing import Optional

from captioning.errors import ConfigError
from captioning.objectives.base import Objective, ObjectiveOutput
from captioning.objectives.cross_entropy import CrossEntropy
from captioning.objectives.reinforce import HardAttentionReinforce
from captioning.objectives.scst import SCST

#: the objectives a config or checkpoint may name (nothing else is imported from a checkpoint)
OBJECTIVES = {cls.__name__: cls for cls in (CrossEntropy, HardAttentionReinforce, SCST)}


def objective_for(attention_kind: str, objective: Optional[Objective] = None) -> Objective:
    """``objective``, checked against the decoder's attention kind, or that kind's paper objective."""
    if objective is None:
        return HardAttentionReinforce() if attention_kind == "hard" else CrossEntropy()
    if attention_kind not in objective.attention_kinds:
        raise ConfigError(
            f"model.objective: {type(objective).__name__} does not train {attention_kind} attention "
            f"(it trains {' or '.join(objective.attention_kinds)}); change model.objective or model.decoder.attention_kind"
        )
    return objective


def objective_from_spec(spec: dict) -> Objective:
    """The objective of a {"class_path", "init_args"} entry (a checkpoint's), from OBJECTIVES only."""
    name = str(spec.get("class_path", "")).rsplit(".", 1)[-1]
    if name not in OBJECTIVES:
        raise ConfigError(f"unknown objective {spec.get('class_path')!r}; expected one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name](**(spec.get("init_args") or {}))


__all__ = ["Objective", "ObjectiveOutput", "CrossEntropy", "HardAttentionReinforce", "SCST", "OBJECTIVES",
           "objective_for", "objective_from_spec"]
