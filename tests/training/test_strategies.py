"""The training package's pieces: the step strategy chosen once from the options, the callbacks the
module brings, the guards, and the Gumbel objective's earlier spelling in configs and checkpoints."""

from types import SimpleNamespace

import pytest
import torch

from captioning.errors import CaptioningError, ConfigError
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.objectives import (
    OBJECTIVES,
    HardAttentionGumbel,
    HardAttentionReinforce,
    current_spelling,
    objective_from_spec,
)
from captioning.training.guards import TF32, NonFiniteCount, StepSeeding, step_seed
from captioning.training.module import CaptioningModule
from captioning.training.strategies import CapturedStep, EagerStep, StaticStep
from captioning.vocab import Vocabulary


@pytest.mark.parametrize(
    "options, kind, automatic",
    [
        ({}, EagerStep, True),
        ({"static_shapes": True}, StaticStep, True),
        ({"cuda_graphs": True}, CapturedStep, False),
        ({"cuda_graphs": True, "static_shapes": True}, CapturedStep, False),
    ],
)
def test_the_step_is_chosen_once_from_the_options(options, kind, automatic):
    module = CaptioningModule(**options)
    assert type(module.step_strategy) is kind and module.automatic_optimization is automatic
    callbacks = module.configure_callbacks()
    assert [type(c) for c in callbacks][:2] == [StepSeeding, TF32]
    assert any(isinstance(c, NonFiniteCount) for c in callbacks) is (kind is CapturedStep)
    assert not any(isinstance(c, TF32) for c in CaptioningModule(tf32=False, **options).configure_callbacks())
    # the saved settings are the options as given
    assert {k: module.hparams[k] for k in ("static_shapes", "cuda_graphs")} == {
        "static_shapes": options.get("static_shapes", False),
        "cuda_graphs": options.get("cuda_graphs", False),
    }


def test_bad_step_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="model.nonfinite_loss: expected 'error' or 'skip'"):
        CaptioningModule(nonfinite_loss="ignore")
    with pytest.raises(ConfigError, match="model.length_buckets"):
        CaptioningModule(static_shapes=True, length_buckets=(0,))


def test_eager_and_static_steps_give_the_same_loss():
    torch.manual_seed(0)
    vocab = Vocabulary.build([["a", "red", "circle", "on", "the", "left"]], min_freq=1)
    captions = torch.tensor([[1, 4, 5, 6, 2, 0, 0], [1, 7, 8, 9, 4, 5, 2]])
    batch = {"images": torch.rand(2, 3, 16, 16), "captions": captions, "lengths": torch.tensor([5, 7])}
    losses = []
    for static in (False, True):
        module = CaptioningModule(
            EncoderConfig(channels=(4, 8, 8), dim=8),
            DecoderConfig(8, 8, 8, dropout=0.0),
            image_size=16,
            static_shapes=static,
            length_buckets=(12,),
        )
        torch.manual_seed(1)
        module.set_vocab(vocab)
        module.model.double()
        out = module.step_strategy(module, {**batch, "images": batch["images"].double()}, 0)
        losses.append(out.loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-10, atol=1e-12)


def test_step_seeding_follows_the_run_seed_the_step_and_the_rank():
    seeding = StepSeeding()
    torch.manual_seed(7)
    seeding.on_fit_start(None, None)
    seeding.on_train_batch_start(SimpleNamespace(global_step=12, global_rank=1), None, None, 0)
    assert torch.initial_seed() == step_seed(7, 12, 1)


def test_the_captured_steps_nonfinite_count_is_read_every_n_steps():
    count = NonFiniteCount(every=3)
    trainer = SimpleNamespace(global_step=1, current_epoch=0)
    count.add(torch.tensor(True))
    count.on_train_batch_end(trainer, None, None, None, 0)
    count.add(torch.tensor(False))
    trainer.global_step = 2
    count.on_train_batch_end(trainer, None, None, None, 0)  # not read at step 2
    trainer.global_step = 3
    with pytest.raises(CaptioningError, match=r"non-finite loss in 1 step\(s\) at or before global step 3"):
        count.on_train_batch_end(trainer, None, None, None, 0)
    with pytest.raises(CaptioningError):
        count.on_validation_start(trainer, None)


# ---------------------------------------------------------------------- the Gumbel objective's spellings
OLD_GUMBEL = {
    "class_path": "captioning.objectives.reinforce.HardAttentionReinforce",
    "init_args": {
        "doubly_stochastic": 0.5,
        "lambda_r": 0.3,
        "lambda_e": 0.01,
        "baseline": "learned",
        "baseline_lr": 0.2,
        "normalize_reward": True,
        "semi_sampling_per": "image",
        "estimator": "gumbel",
        "gumbel_temperature": 2.0,
        "gumbel_temperature_final": 0.5,
        "gumbel_anneal_steps": 10,
    },
}


def test_estimator_gumbel_is_read_as_the_gumbel_objective():
    objective = objective_from_spec(OLD_GUMBEL)
    assert type(objective) is HardAttentionGumbel
    assert objective.settings == {
        **HardAttentionGumbel().settings,
        "doubly_stochastic": 0.5,
        "lambda_e": 0.01,
        "semi_sampling_per": "image",
        "gumbel_temperature": 2.0,
        "gumbel_temperature_final": 0.5,
        "gumbel_anneal_steps": 10,
    }
    # its spec names the class, and is read back as it is
    assert objective.spec()["class_path"] == "captioning.objectives.gumbel.HardAttentionGumbel"
    assert objective_from_spec(objective.spec()).settings == objective.settings
    assert current_spelling("HardAttentionReinforce", {"estimator": "reinforce"}) == (
        "HardAttentionReinforce",
        {"estimator": "reinforce"},
    )
    # REINFORCE by its earlier settings (estimator reinforce and unused gumbel ones): REINFORCE as before
    old = {**OLD_GUMBEL["init_args"], "estimator": "reinforce"}
    reinforce = objective_from_spec({**OLD_GUMBEL, "init_args": old})
    assert (
        type(reinforce) is HardAttentionReinforce and reinforce.lambda_r == 0.3 and reinforce.baseline_kind == "learned"
    )
    # both spellings name registered objectives (the earlier one by its class's name)
    assert OBJECTIVES.get("gumbel") is HardAttentionGumbel and OBJECTIVES.get("reinforce") is HardAttentionReinforce


def test_a_gumbel_checkpoint_of_the_earlier_spelling_loads_its_running_state():
    """Its objective state holds REINFORCE's buffers too (never updated by that estimator): dropped."""
    module = CaptioningModule(decoder=DecoderConfig(attention_kind="hard"), objective=objective_from_spec(OLD_GUMBEL))
    earlier = HardAttentionReinforce()  # the buffers an earlier checkpoint of either estimator holds
    earlier.baseline.fill_(-2.5)
    earlier.steps_done.fill_(4)
    state = {f"objective.{k}": v for k, v in earlier.state_dict().items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if k.startswith("objective.")]
    assert module.objective.baseline.item() == -2.5 and int(module.objective.steps_done) == 4
    assert set(module.objective.optional_state) >= {"advantage_var", "baseline_weight", "baseline_bias"}


def test_the_gumbel_objective_trains_hard_attention_only_and_is_captured_without_a_schedule():
    with pytest.raises(ConfigError, match="does not train soft attention"):
        CaptioningModule(objective=HardAttentionGumbel())
    hard = DecoderConfig(attention_kind="hard")
    assert (
        type(CaptioningModule(decoder=hard, objective=HardAttentionGumbel(), cuda_graphs=True).step_strategy)
        is CapturedStep
    )
    with pytest.raises(ConfigError, match="cuda_graphs.*Gumbel temperature schedule"):
        CaptioningModule(
            decoder=hard,
            cuda_graphs=True,
            objective=HardAttentionGumbel(gumbel_temperature_final=0.5, gumbel_anneal_steps=10),
        )
