"""The training recipes: learning-rate schedules (resumed exactly), scheduled sampling, label
smoothing, the moving average of the weights, the validation of the final weights, and the
options' wrong values (docs/RECIPES.md)."""

import glob
import math
import os
import signal

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from captioning.errors import ConfigError
from captioning.fast.lstm import FastLSTM
from captioning.files import safe_torch_load
from captioning.models.decoder import DecoderOutput
from captioning.objectives import CrossEntropy, HardAttentionReinforce
from captioning.training.optim import OptimizerConfig
from captioning.training.schedules import ScheduleConfig, StepDecay, WarmupDecay, with_schedule
from tests.helpers import fit_args


class Record(Callback):
    """What the tests look at: the learning rate of each optimizer step, the weights after each
    step, and the steps validated (and their CIDEr)."""

    def __init__(self):
        self.lrs, self.weights, self.validated = {}, {}, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.weights[trainer.global_step] = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated.append((trainer.global_step, float(trainer.callback_metrics["val/CIDEr"])))


def fit(annotations, root, steps_per_epoch, extra=()):
    """A tiny `captioning fit`; returns (its Record, the checkpoint folder)."""
    from captioning.training.cli import run_lightning_cli

    cli = run_lightning_cli(
        fit_args(
            annotations,
            root,
            steps=steps_per_epoch,
            extra=["--model.decoder.dropout", "0.0", f"--trainer.callbacks+={__name__}.Record", *extra],
        )
    )
    (record,) = [c for c in cli.trainer.callbacks if isinstance(c, Record)]
    return record, os.path.join(root, "checkpoints")


# ---------------------------------------------------------------------- learning-rate schedules
def test_step_decay_is_ruotianluos():
    decay = StepDecay(start=0, every=3, rate=0.8)  # the COCO recipe: x0.8 every 3 epochs from epoch 0
    assert [decay(e) for e in range(7)] == pytest.approx([1, 1, 1, 0.8, 0.8, 0.8, 0.64])
    assert [StepDecay(2, 2, 0.5)(e) for e in range(6)] == pytest.approx([1, 1, 1, 1, 0.5, 0.5])


def test_warmup_then_cosine_or_linear():
    cosine, linear = WarmupDecay(2, 6, 0.0, "cosine"), WarmupDecay(2, 6, 0.1, "linear")
    assert [cosine(t) for t in range(7)] == pytest.approx(
        [0.5, 1, 1, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0]
    )
    assert [linear(t) for t in range(7)] == pytest.approx([0.5, 1, 1, 0.775, 0.55, 0.325, 0.1])


def test_plateau_watches_validation_cider():
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    out = with_schedule(optimizer, ScheduleConfig(kind="plateau", rate=0.8, patience=2))
    scheduler = out["lr_scheduler"]["scheduler"]
    assert out["lr_scheduler"]["monitor"] == "val/CIDEr" and scheduler.mode == "max"
    for cider in (0.5, 0.4, 0.4):  # two validations without improvement
        scheduler.step(cider)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.8)
    assert with_schedule(optimizer, ScheduleConfig()) is optimizer  # none: the optimizer alone


@pytest.mark.parametrize(
    "schedule",
    [
        [
            "--model.optimizer.schedule.kind",
            "step",
            "--model.optimizer.schedule.interval",
            "step",
            "--model.optimizer.schedule.start",
            "1",
            "--model.optimizer.schedule.every",
            "2",
            "--model.optimizer.schedule.rate",
            "0.5",
        ],
        [
            "--model.optimizer.schedule.kind",
            "warmup_cosine",
            "--model.optimizer.schedule.warmup_steps",
            "2",
            "--model.optimizer.schedule.total_steps",
            "7",
        ],
        [
            "--model.optimizer.schedule.kind",
            "step",
            "--model.optimizer.schedule.every",
            "1",
            "--model.optimizer.schedule.rate",
            "0.5",
        ],
        [  # a decay to the run's end, the run's length from max_epochs (3 x 3 steps), not max_steps
            "--model.optimizer.schedule.kind",
            "warmup_linear",
            "--model.optimizer.schedule.warmup_steps",
            "2",
            "--model.optimizer.schedule.final_lr_ratio",
            "0.1",
            "--trainer.max_steps",
            "-1",
        ],
    ],
    ids=["step-per-step", "warmup_cosine", "step-per-epoch", "warmup_linear-run-length"],
)
def test_a_resumed_run_has_the_uninterrupted_runs_learning_rates(tiny_shapes, tmp_path, schedule):
    """Resumed mid-epoch (step 4 of 3 x 3), a run takes the uninterrupted run's remaining steps at its rates."""
    common = [
        "--trainer.max_epochs",
        "3",
        "--trainer.max_steps",
        "7",
        *schedule,  # a checkpoint after every step
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps",
        "1",
        "--trainer.callbacks.save_top_k",
        "-1",
        "--trainer.callbacks.filename",
        "{step}",
    ]
    whole, folder = fit(tiny_shapes, tmp_path / "whole", 3, common)
    rest, _ = fit(tiny_shapes, tmp_path / "resumed", 3, [*common, "--ckpt_path", os.path.join(folder, "step=4.ckpt")])
    steps = 9 if "-1" in schedule else 7
    assert sorted(whole.lrs) == list(range(steps)) and len(set(whole.lrs.values())) > 1
    assert sorted(rest.lrs) == list(range(4, steps)) and rest.lrs == {t: whole.lrs[t] for t in range(4, steps)}
    last = steps - 1  # the same batches in the same order: the same weights (no dropout)
    assert all(torch.equal(whole.weights[last][k], v) for k, v in rest.weights[last].items())


# ---------------------------------------------------------------------- scheduled sampling
@pytest.fixture
def small_decoder(make_decoder):
    """conftest's make_decoder at this section's sizes (20 words, D = 16), float32."""
    return lambda **config: make_decoder(
        dtype=torch.float32, vocab_size=20, feature_dim=16, embed_dim=8, hidden_dim=12, **config
    )


CAPTIONS = torch.tensor([[1, 5, 6, 7, 2, 0], [1, 8, 2, 0, 0, 0], [1, 9, 9, 9, 9, 2]])
LENGTHS = torch.tensor([5, 3, 6])


def test_scheduled_sampling_probability_is_ruotianluos():
    objective = CrossEntropy(
        scheduled_sampling_start=0,
        scheduled_sampling_increase_every=5,
        scheduled_sampling_increase_prob=0.05,
        scheduled_sampling_max_prob=0.25,
    )
    assert [objective.sampling_prob(e) for e in (0, 4, 5, 10, 25, 100)] == pytest.approx([0, 0, 0.05, 0.1, 0.25, 0.25])
    assert CrossEntropy().sampling_prob(50) == 0.0


@pytest.mark.parametrize("placement", ["bahdanau", "luong"])
def test_scheduled_sampling_at_p_0_is_teacher_forcing(placement, small_decoder):
    decoder, features = small_decoder(placement=placement), torch.randn(3, 4, 16)
    objective = CrossEntropy(doubly_stochastic=0.5)
    plain, _, _ = objective.likelihood_terms(decoder(features, CAPTIONS, LENGTHS), CAPTIONS)
    for run in (decoder, FastLSTM(decoder)):  # each through its scheduled-sampling loop, a draw never taken
        looped, _, _ = objective.likelihood_terms(run(features, CAPTIONS, LENGTHS, sample_prob=1e-12), CAPTIONS)
        torch.testing.assert_close(looped, plain, rtol=1e-6, atol=1e-6)
    # the objective at p = 0 (before the start epoch) runs the default pass: the same numbers exactly
    scheduled = CrossEntropy(doubly_stochastic=0.5, scheduled_sampling_start=0)
    scheduled.start_epoch(0)
    batch = {"captions": CAPTIONS, "lengths": LENGTHS}
    model = lambda f, c, lengths, **kw: decoder(f, c, lengths, **kw)  # noqa: E731
    assert torch.equal(scheduled(model, features, batch).loss, objective(model, features, batch).loss)


def test_scheduled_sampling_at_p_1_reads_only_sampled_words(small_decoder):
    decoder, features = small_decoder(), torch.randn(3, 4, 16)
    other = CAPTIONS.clone()
    other[:, 1:][CAPTIONS[:, 1:] > 2] = 11  # other words, the same lengths
    logits = []
    for captions in (CAPTIONS, other):
        torch.manual_seed(5)
        logits.append(decoder(features, captions, LENGTHS, sample_prob=1.0).logits)
    assert torch.equal(logits[0], logits[1])  # the caption's words after BOS are never read
    forced = decoder(features, CAPTIONS, LENGTHS, static=True).logits
    assert not torch.allclose(forced, logits[0])
    torch.manual_seed(5)
    sampled = decoder(features, CAPTIONS, LENGTHS, sample_prob=1.0)
    sampled.logits.sum().backward()  # the draws are detached: the pass is differentiable
    assert decoder.E.weight.grad is not None


def test_scheduled_sampling_refuses_hard_attention(small_decoder):
    with pytest.raises(ConfigError, match="scheduled_sampling_start"):
        HardAttentionReinforce(scheduled_sampling_start=0)
    with pytest.raises(ConfigError, match="soft attention only"):
        small_decoder(attention_kind="hard")(torch.randn(3, 4, 16), CAPTIONS, LENGTHS, sample_prob=0.5)


# ---------------------------------------------------------------------- label smoothing
def test_label_smoothing_against_a_hand_computation():
    torch.manual_seed(1)
    B, T, V, eps = 2, 3, 5, 0.1
    logits = torch.randn(B, T, V)
    targets = torch.tensor([[1, 3, 2], [4, 2, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    captions = torch.cat([torch.ones(B, 1, dtype=torch.long), targets], 1)
    out = DecoderOutput(
        logits=logits[mask],
        mask=mask,
        alphas=torch.zeros(B, T, 4),
        betas=torch.zeros(B, T),
        locations=torch.zeros(B, T, dtype=torch.long),
    )
    hand = []
    for b in range(B):
        total = 0.0
        for t in range(T):
            if mask[b, t]:
                log_p = [
                    logits[b, t, v].item() - math.log(sum(math.exp(x) for x in logits[b, t].tolist())) for v in range(V)
                ]
                total += -(1 - eps) * log_p[targets[b, t]] - eps * sum(log_p) / V
        hand.append(total)
    loss, log_likelihood, logs = CrossEntropy(doubly_stochastic=0.0, label_smoothing=eps).likelihood_terms(
        out, captions
    )
    assert loss.item() == pytest.approx(sum(hand) / B, rel=1e-6)
    plain, plain_ll, _ = CrossEntropy(doubly_stochastic=0.0).likelihood_terms(out, captions)
    assert torch.equal(log_likelihood, plain_ll)  # log p(y | a) and the logged NLL stay the plain ones
    # the same on the static pass's (B, T, V) logits
    static = DecoderOutput(logits=logits, mask=mask, alphas=out.alphas, betas=out.betas, locations=out.locations)
    static_loss, _, _ = CrossEntropy(doubly_stochastic=0.0, label_smoothing=eps).likelihood_terms(static, captions)
    assert static_loss.item() == pytest.approx(sum(hand) / B, rel=1e-6)


# ---------------------------------------------------------------------- the moving average of the weights
def test_the_weight_average_equals_a_hand_computed_average(tiny_shapes, tmp_path):
    decay = 0.5
    record, folder = fit(
        tiny_shapes, tmp_path, 3, ["--model.optimizer.ema_decay", str(decay), "--model.optimizer.ema_start_step", "1"]
    )
    w = record.weights
    assert sorted(w) == [1, 2, 3]
    # updates after the optimizer steps of 0-based index >= 1 (global steps 2 and 3); the first copies
    # (the float buffers too, e.g. batch-norm statistics; a step counter is no weight)
    hand = {k: decay * w[2][k] + (1 - decay) * w[3][k] for k in w[3] if w[3][k].is_floating_point()}
    (best,) = glob.glob(os.path.join(folder, "best-*.ckpt"))  # the one validation: the final weights, step 3
    ckpt = safe_torch_load(best)
    assert ckpt["global_step"] == 3
    for k, v in hand.items():
        torch.testing.assert_close(ckpt["state_dict"][f"model.{k}"], v)  # the average is the model saved
        torch.testing.assert_close(
            ckpt["current_model_state"][f"model.{k}"], w[3][k]
        )  # the training weights, to resume
    assert not torch.equal(hand["decoder.L_o.weight"], w[3]["decoder.L_o.weight"])


def test_before_the_average_starts_the_training_weights_are_the_model(tiny_shapes, tmp_path):
    """ema_start_step after the first validation: that validation scores the training weights (as a
    run without the average does), and the checkpoints until then save them as the model."""
    every_step = [
        "--trainer.max_epochs",
        "2",
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps",
        "1",
        "--trainer.callbacks.save_top_k",
        "-1",
        "--trainer.callbacks.filename",
        "{step}",
    ]
    decay = 0.5
    record, folder = fit(
        tiny_shapes,
        tmp_path / "ema",
        3,
        [*every_step, "--model.optimizer.ema_decay", str(decay), "--model.optimizer.ema_start_step", "4"],
    )
    plain, _ = fit(tiny_shapes, tmp_path / "plain", 3, every_step)
    w = record.weights
    assert record.validated[0] == plain.validated[0]  # step 3: the same weights scored
    early = safe_torch_load(os.path.join(folder, "step=3.ckpt"))
    for k, v in w[3].items():
        torch.testing.assert_close(early["state_dict"][f"model.{k}"], v)  # not the initial weights
    # updates after the optimizer steps of 0-based index >= 4 (global steps 5 and 6); the first copies
    late = safe_torch_load(os.path.join(folder, "step=6.ckpt"))
    for k in ("decoder.L_o.weight", "encoder.body.0.weight"):
        torch.testing.assert_close(late["state_dict"][f"model.{k}"], decay * w[5][k] + (1 - decay) * w[6][k])


# ---------------------------------------------------------------------- the final weights are validated
def test_a_run_stopped_by_max_steps_validates_its_final_weights(tiny_shapes, tmp_path, capfd):
    record, folder = fit(tiny_shapes, tmp_path, 4, ["--trainer.max_epochs", "3", "--trainer.max_steps", "6"])
    assert "PTBTokenizer" not in "".join(capfd.readouterr())  # validation's tokens are metrics/ptb.py's, no Java
    assert [step for step, _ in record.validated] == [4, 6]  # the epoch's end, then the last step
    assert safe_torch_load(os.path.join(folder, "last.ckpt"))["global_step"] == 6
    (best,) = glob.glob(os.path.join(folder, "best-*.ckpt"))
    (cider4, cider6) = [c for _, c in record.validated]
    assert f"step={6 if cider6 > cider4 else 4}" in best


# ---------------------------------------------------------------------- wrong values: one line naming the field
@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: ScheduleConfig(kind="exponential"), "optimizer.schedule.kind"),
        (lambda: ScheduleConfig(interval="batch"), "optimizer.schedule.interval"),
        (lambda: ScheduleConfig(every=0), "optimizer.schedule.every"),
        (lambda: ScheduleConfig(start=-1), "optimizer.schedule.start"),
        (lambda: ScheduleConfig(rate=0.0), "optimizer.schedule.rate"),
        (lambda: ScheduleConfig(rate=float("nan")), "optimizer.schedule.rate"),
        (lambda: ScheduleConfig(rate=1.5), "optimizer.schedule.rate"),
        (lambda: ScheduleConfig(patience=0), "optimizer.schedule.patience"),
        (lambda: ScheduleConfig(warmup_steps=-1), "optimizer.schedule.warmup_steps"),
        (lambda: ScheduleConfig(total_steps=0), "optimizer.schedule.total_steps"),
        (lambda: ScheduleConfig(warmup_steps=10, total_steps=10), "optimizer.schedule.warmup_steps"),
        (lambda: ScheduleConfig(final_lr_ratio=float("inf")), "optimizer.schedule.final_lr_ratio"),
        (lambda: OptimizerConfig(lr=0.0), "optimizer.lr"),
        (lambda: OptimizerConfig(lr=float("inf")), "optimizer.lr"),
        (lambda: OptimizerConfig(encoder_lr=-1e-4), "optimizer.encoder_lr"),
        (lambda: OptimizerConfig(weight_decay=float("nan")), "optimizer.weight_decay"),
        (lambda: OptimizerConfig(ema_decay=1.0), "optimizer.ema_decay"),
        (lambda: OptimizerConfig(ema_decay=0.0), "optimizer.ema_decay"),
        (lambda: OptimizerConfig(ema_decay=float("nan")), "optimizer.ema_decay"),
        (lambda: OptimizerConfig(ema_start_step=-1), "optimizer.ema_start_step"),
        (lambda: CrossEntropy(label_smoothing=1.0), "objective.label_smoothing"),
        (lambda: CrossEntropy(label_smoothing=-0.1), "objective.label_smoothing"),
        (lambda: CrossEntropy(label_smoothing=float("nan")), "objective.label_smoothing"),
        (lambda: CrossEntropy(scheduled_sampling_start=-1), "objective.scheduled_sampling_start"),
        (lambda: CrossEntropy(scheduled_sampling_increase_every=0), "objective.scheduled_sampling_increase_every"),
        (
            lambda: CrossEntropy(scheduled_sampling_increase_prob=float("inf")),
            "objective.scheduled_sampling_increase_prob",
        ),
        (lambda: CrossEntropy(scheduled_sampling_max_prob=1.5), "objective.scheduled_sampling_max_prob"),
        (
            lambda: with_schedule(
                torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))]),
                ScheduleConfig(kind="warmup_linear"),
                automatic=False,
            ),
            "optimizer.schedule",
        ),
    ],
)
def test_wrong_values_are_one_line_naming_the_field(make, field):
    with pytest.raises(ConfigError) as err:
        make()
    assert f"model.{field}" in str(err.value) and "\n" not in str(err.value)


def test_a_run_shorter_than_its_warm_up_trains_inside_the_warm_up(caplog):
    """A trial run of a few steps of a config with a long warm-up (the demo's) is not refused:
    its learning rate climbs the warm-up and the log says the run ends inside it."""
    from types import SimpleNamespace

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    config = ScheduleConfig(kind="warmup_linear", warmup_steps=100, final_lr_ratio=1.0)
    with caplog.at_level("WARNING"):
        scheduler = with_schedule(optimizer, config, SimpleNamespace(max_steps=3))["lr_scheduler"]["scheduler"]
    assert "the run's 3 steps end inside the 100-step warm-up" in caplog.text
    lrs = []
    for _ in range(3):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.002 * 1 / 100, 0.002 * 2 / 100, 0.002 * 3 / 100])


def test_the_checkpoint_of_an_earlier_version_reads_its_optimizer_settings():
    config = OptimizerConfig(**{"lr": 1e-3, "weight_decay": 0.0, "encoder_lr": None})  # no schedule, no average
    assert config.schedule == ScheduleConfig() and config.ema_decay is None
    saved = {"lr": 1e-3, "schedule": {"kind": "step", "every": 2}}  # this version's, as plain values
    assert OptimizerConfig(**saved).schedule == ScheduleConfig(kind="step", every=2)


def test_validation_tokenizes_in_python_and_test_with_java_where_present():
    from captioning.training.module import CaptioningModule

    evaluators = CaptioningModule().evaluators
    assert evaluators["val"].tokenizer == "python" and evaluators["test"].tokenizer == "auto"


def test_a_resumed_run_has_the_uninterrupted_runs_average(tiny_shapes, tmp_path):
    every_step = [
        "--model.optimizer.ema_decay",
        "0.5",
        "--trainer.max_epochs",
        "2",
        "--trainer.max_steps",
        "5",
        "--trainer.callbacks+=ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps",
        "1",
        "--trainer.callbacks.save_top_k",
        "-1",
        "--trainer.callbacks.filename",
        "{step}",
    ]
    _, whole = fit(tiny_shapes, tmp_path / "whole", 3, every_step)
    _, resumed = fit(
        tiny_shapes, tmp_path / "resumed", 3, [*every_step, "--ckpt_path", os.path.join(whole, "step=2.ckpt")]
    )
    a, b = (safe_torch_load(os.path.join(folder, "step=5.ckpt")) for folder in (whole, resumed))
    for key in ("state_dict", "current_model_state"):  # the average, and the training weights
        for name, value in a[key].items():
            torch.testing.assert_close(b[key][name], value, msg=f"{key} {name}")


class SignalAt(Callback):
    """Sends this process SIGTERM once, at the start of the first training or validation batch after
    optimizer step ``step`` (LastCheckpoint, training/callbacks.py, acts on it at that batch's end)."""

    def __init__(self, step: int, where: str):
        self.step, self.where, self.sent = step, where, False

    def _send(self, trainer) -> None:
        if not self.sent and not trainer.sanity_checking and trainer.global_step == self.step:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.where == "training":
            self._send(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.where == "validation":
            self._send(trainer)


@pytest.mark.parametrize("where", ["validation", "training"])
def test_a_run_signalled_with_the_average_on_resumes_to_the_uninterrupted_run(where, tiny_shapes, tmp_path):
    """SIGTERM inside a validation (the average swapped in) or inside a training batch (the
    average's update for that step not yet made when last.ckpt is written): the checkpoint holds the
    average as the model and the training weights beside it, and the resumed run ends as the
    uninterrupted one (the average, the training weights, Adam's moments)."""
    from captioning.training.cli import run_lightning_cli

    ema = [
        "--model.optimizer.ema_decay",
        "0.5",
        "--model.optimizer.ema_start_step",
        "1",
        "--trainer.max_epochs",
        "2",
        "--model.decoder.dropout",
        "0.0",
    ]

    def run(root, extra=()):
        return run_lightning_cli(fit_args(tiny_shapes, root, steps=3, extra=[*ema, *extra]))

    run(
        tmp_path / "whole",
        [
            "--trainer.callbacks+=ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps",
            "1",
            "--trainer.callbacks.save_top_k",
            "-1",
            "--trainer.callbacks.filename",
            "{step}",
        ],
    )
    stopped = tmp_path / "stopped"
    step = 3 if where == "validation" else 2  # the validation at the end of epoch 0; a batch inside it
    with pytest.raises(SystemExit) as stop:
        run(
            stopped,
            [
                f"--trainer.callbacks+={__name__}.SignalAt",
                "--trainer.callbacks.step",
                str(step),
                "--trainer.callbacks.where",
                where,
            ],
        )
    assert stop.value.code == 128 + signal.SIGTERM
    last = stopped / "checkpoints" / "last.ckpt"
    at_stop = safe_torch_load(last)
    stopped_at = at_stop["global_step"]
    assert stopped_at == (3 if where == "validation" else 3)  # a training batch: the step under way is made
    reference = safe_torch_load(tmp_path / "whole" / "checkpoints" / f"step={stopped_at}.ckpt")
    for key in ("state_dict", "current_model_state"):  # the average, and the training weights, as at that step
        for name, value in reference[key].items():
            assert torch.equal(at_stop[key][name], value), f"{key} {name}"

    run(stopped, ["--ckpt_path", str(last)])
    whole = safe_torch_load(tmp_path / "whole" / "checkpoints" / "step=6.ckpt")
    resumed = safe_torch_load(last)
    assert resumed["global_step"] == whole["global_step"] == 6
    for key in ("state_dict", "current_model_state"):
        for name, value in whole[key].items():
            assert torch.equal(resumed[key][name], value), f"{key} {name}"
    for a, b in zip(whole["optimizer_states"][0]["state"].values(), resumed["optimizer_states"][0]["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_the_estimate_of_the_run_is_read_when_training_starts_and_only_for_a_decay():
    """warmup_* with final_lr_ratio 1 (the demo's): the run's length changes nothing, so the trainer's
    estimate (which builds the training loader) is never read; a decaying schedule reads it when
    training starts (RunLength), not while the optimizers are configured, before a resumed run
    restores its place in the epoch."""
    from types import SimpleNamespace

    from captioning.training.schedules import RunLength

    class Trainer(SimpleNamespace):
        reads = 0

        @property
        def estimated_stepping_batches(self):
            Trainer.reads += 1
            return 50

    def rates(config):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
        trainer = Trainer(max_steps=-1, max_epochs=5)
        scheduler = with_schedule(optimizer, config, trainer)["lr_scheduler"]["scheduler"]
        assert Trainer.reads == 0
        trainer.lr_scheduler_configs = [SimpleNamespace(scheduler=scheduler)]
        RunLength().on_train_start(trainer, None)
        out = []
        for _ in range(40):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    flat = rates(ScheduleConfig(kind="warmup_linear", warmup_steps=10, final_lr_ratio=1.0))
    assert Trainer.reads == 0 and flat[9:] == pytest.approx([0.002] * 31) and flat[0] == pytest.approx(0.0002)
    decaying = rates(ScheduleConfig(kind="warmup_linear", warmup_steps=10, final_lr_ratio=0.1))
    assert Trainer.reads == 1 and decaying[39] == pytest.approx(0.002 * (1 - 0.9 * 29 / 40))  # 50 steps


def test_a_decay_without_an_end_is_a_clear_error():
    from types import SimpleNamespace

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    config = ScheduleConfig(kind="warmup_cosine", warmup_steps=10, final_lr_ratio=0.0)
    with pytest.raises(ConfigError, match="needs the run's length") as err:
        with_schedule(optimizer, config, SimpleNamespace(max_steps=-1, max_epochs=-1))
    assert "\n" not in str(err.value)
