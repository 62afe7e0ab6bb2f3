"""The objectives' registry: a new objective is one class registered beside itself, named by a config or a
checkpoint, trained by `captioning fit` and rebuilt from the checkpoint; the hooks the LightningModule calls."""

from pathlib import Path

import pytest
import torch

from captioning.errors import CaptioningError, ConfigError
from captioning.objectives import (
    OBJECTIVES,
    SCST,
    CrossEntropy,
    HardAttentionGumbel,
    HardAttentionReinforce,
    Objective,
    ObjectiveOutput,
    list_objectives,
    objective_class,
    objective_from_spec,
)
from captioning.objectives.cross_entropy import caption_log_likelihood
from captioning.storage.checkpoint import read_checkpoint_file
from captioning.training.cli import run_lightning_cli
from captioning.training.loading import load_module
from tests.helpers import fit_args


@OBJECTIVES.register("toy")
class ToyObjective(Objective):
    """The caption NLL times ``weight``; records the hooks the training module calls."""

    attention_kinds = ("soft",)

    def __init__(self, weight: float = 1.0):
        super().__init__(weight=weight)
        self.weight = weight
        self.calls: list = []

    def forward(self, model, features, batch, static=False):
        captions = batch["captions"]
        out = model(features, captions, batch["lengths"], static=static)
        nll = -caption_log_likelihood(out.logits, captions[:, 1:], out.mask).mean()
        return ObjectiveOutput(self.weight * nll, captions.size(0), {"toy_nll": nll.detach()})

    def setup(self, datamodule):
        self.calls.append(("setup", len(datamodule.records("train"))))

    def start_epoch(self, epoch):
        self.calls.append(("start_epoch", epoch))

    def commit(self, output):
        self.calls.append(("commit",))
        return {"toy_commits": torch.tensor(float(sum(c == ("commit",) for c in self.calls)))}

    def checkpoint_state(self):
        return {"toy_calls": len(self.calls)}


def test_the_built_in_objectives_are_registered_by_name():
    assert list_objectives()[:4] == ["cross_entropy", "gumbel", "reinforce", "scst"]
    expected = {
        "cross_entropy": CrossEntropy,
        "gumbel": HardAttentionGumbel,
        "reinforce": HardAttentionReinforce,
        "scst": SCST,
    }
    for name, cls in expected.items():
        assert OBJECTIVES.get(name) is cls
        # a config's or checkpoint's class_path: the package's name, the module's, or the registered name
        for class_path in (f"captioning.objectives.{cls.__name__}", f"{cls.__module__}.{cls.__name__}", name):
            assert objective_class(class_path) is cls
    assert (
        type(objective_from_spec({"class_path": "reinforce", "init_args": {"lambda_r": 0.3}})) is HardAttentionReinforce
    )


def test_an_unknown_objective_is_one_line_naming_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        objective_from_spec({"class_path": "builtins.eval", "init_args": {}})
    message = str(err.value)
    assert "\n" not in message and message.startswith("model.objective: unknown objective 'builtins.eval'")
    for name in list_objectives():
        assert name in message
    assert "CrossEntropy" in message and "ToyObjective" in message  # what a class_path may end in
    with pytest.raises(ValueError, match="registered twice"):
        OBJECTIVES.register("toy")(CrossEntropy)


def test_a_registered_objective_is_built_by_its_name():
    objective = objective_from_spec({"class_path": "toy", "init_args": {"weight": 0.5}})
    assert type(objective) is ToyObjective and objective.weight == 0.5
    # its spec names its class, which is read back to the same objective
    assert objective.spec() == {"class_path": f"{__name__}.ToyObjective", "init_args": {"weight": 0.5}}
    assert type(objective_from_spec(objective.spec())) is ToyObjective


def test_the_declared_hooks_do_nothing_by_default():
    objective = Objective()
    assert objective.commit(None) == {} and objective.checkpoint_state() == {} and objective.optional_state == ()
    assert (
        objective.setup(None) is None and objective.start_epoch(0) is None and objective.static_step_problem() is None
    )
    assert objective.load_checkpoint_state({"x": 1}) is None


def test_a_new_objective_trains_through_fit_and_its_checkpoint_rebuilds_it(tiny_shapes, tmp_path):
    extra = ["--model.objective", f"{__name__}.ToyObjective", "--model.objective.init_args.weight", "0.5"]
    cli = run_lightning_cli(fit_args(tiny_shapes, tmp_path, steps=2, extra=extra))
    objective = cli.model.objective
    assert type(objective) is ToyObjective and objective.weight == 0.5 and cli.trainer.global_step == 2
    # the module called every hook: the training references once, the epoch clock, a commit per step
    assert objective.calls[:2] == [("setup", 40), ("start_epoch", 0)] and objective.calls.count(("commit",)) == 2
    assert float(cli.trainer.callback_metrics["train/toy_commits"]) == 2.0
    last = Path(cli.trainer.checkpoint_callback.last_model_path)
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["objective_state"] == {"toy_calls": len(objective.calls)}
    assert checkpoint["hyper_parameters"]["objective"] == {
        "class_path": f"{__name__}.ToyObjective",
        "init_args": {"weight": 0.5},
    }
    assert read_checkpoint_file(last).card["training"]["objective"]["init_args"] == {"weight": 0.5}
    module = load_module(last)
    assert type(module.objective) is ToyObjective and module.objective.settings == {"weight": 0.5}


def test_a_checkpoint_of_an_unregistered_objective_is_refused_in_one_line(tiny_checkpoint, tmp_path):
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    assert "objective_state" not in checkpoint  # cross-entropy keeps no state besides its buffers
    checkpoint["hyper_parameters"]["objective"] = {"class_path": "mypackage.objectives.Unknown", "init_args": {}}
    torch.save(checkpoint, tmp_path / "unknown.ckpt")
    with pytest.raises(CaptioningError) as err:
        read_checkpoint_file(str(tmp_path / "unknown.ckpt"))
    assert "\n" not in str(err.value) and "unknown objective 'mypackage.objectives.Unknown'" in str(err.value)
    assert "cross_entropy" in str(err.value)
