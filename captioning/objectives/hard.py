"""What the two hard-attention objectives share (reinforce.py: the paper's REINFORCE, gumbel.py:
straight-through Gumbel-softmax): the caption NLL through sampled locations (Eq. 14's terms, from
CrossEntropy), the semi-sampling draw (Section 4.1), the entropy bonus, their schedules and the
running mean of the reward.

The semi-sampling draw: with probability ``semi_sampling_p`` a caption takes the expected context
instead of a sampled location; ``semi_sampling_per`` draws that once per "batch" (the authors'
code) or per "image" (the paper), or "expectation": no draw, every caption decoded twice (expected
context and sampled locations), the two losses weighted p and 1 - p -- the exact expectation over
the per-image draw. ``semi_sampling_p_final`` / ``semi_sampling_anneal_steps`` move p linearly
(e.g. 1 -> 0.5: every caption starts on the expected context, which trains the attention network
at full rate while alpha is still near uniform). ``lambda_e_final`` / ``entropy_anneal_steps`` move
the entropy bonus linearly from lambda_e.

``label_smoothing`` (CrossEntropy's epsilon) smooths the word targets of the likelihood term, the
loss that trains the decoder through the expected or the sampled context; the reward
(:func:`caption_reward`) stays the plain log p(y | s, a) (reinforce.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from captioning.compat import NEWER_OBJECTIVE_STATE
from captioning.errors import ConfigError
from captioning.objectives.base import ObjectiveOutput
from captioning.objectives.cross_entropy import CrossEntropy

SEMI_SAMPLING = ("batch", "image", "expectation")


def caption_reward(log_likelihood: Tensor, mask: Tensor, reward_per_step: bool = True) -> Tensor:
    """R per caption (B,), detached: log p(y | s, a) averaged over the caption's real steps (or summed)."""
    steps = mask.sum(1).clamp(min=1)  # (B,)
    return (log_likelihood / steps if reward_per_step else log_likelihood).detach()


def weighted_sum_mean(x: Tensor, weight: Tensor | None = None) -> Tensor:
    """mean_b weight_b x_b (B,): a batch mean of per-row loss terms with row weights (None: 1)."""
    return (x if weight is None else x * weight).mean()


def weighted_mean(x: Tensor, weight: Tensor | None = None) -> Tensor:
    """The mean over rows of x (B, ...), or its weighted mean with the row weights ``weight`` (B,)."""
    if weight is None:
        return x.mean(0)
    return (x * weight.view(-1, *(1,) * (x.dim() - 1))).sum(0) / weight.sum().clamp(min=1e-12)


def update_baseline(baseline: Tensor, reward: Tensor, decay: float = 0.9, weight: Tensor | None = None) -> Tensor:
    """Exponential moving average b_k = decay * b_{k-1} + (1 - decay) * mean reward (Section 4.1);
    with row weights (``semi_sampling_per: expectation``), the weighted mean reward."""
    return decay * baseline + (1.0 - decay) * weighted_mean(reward, weight).detach()


def anneal(start: float, end: float | None, steps: int, step, geometric: bool = False):
    """``start`` moved to ``end`` over ``steps`` steps (linearly, or geometrically), then ``end``.

    ``step`` an int gives a number; a 0-d tensor gives a 0-d tensor on its device (nothing read back)."""
    if end is None or steps <= 0:
        return start
    f = (step.float() / steps).clamp(0.0, 1.0) if isinstance(step, Tensor) else min(max(step / steps, 0.0), 1.0)
    return start * (end / start) ** f if geometric else start + f * (end - start)


def check_steps(field: str, value) -> None:
    """A schedule's length: an integer >= 0, else a one-line ConfigError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{field}: expected an integer >= 0, got {value!r}")


@dataclass
class SemiSampled:
    """The rows of one step: every caption ``k`` times (samples, or both kinds of context)."""

    features: Tensor  # (B, L, D)
    captions: Tensor  # (B, T + 1)
    lengths: Tensor  # (B,)
    use_expected: Tensor  # (B,) bool: the rows that take the expected context
    weight: Tensor | None  # (B,) row weights of the loss (semi_sampling_per expectation), else None
    p_expected: float | Tensor  # this step's expected-context probability (a 0-d tensor with a schedule)


class HardAttentionObjective(CrossEntropy):
    """The settings and running state both hard-attention objectives have (see the module's docstring).

    Running state, saved in checkpoints with the weights: ``baseline``, the moving average of the
    reward (REINFORCE's b; the Gumbel objective logs it), and ``steps_done``, the schedules' clock.
    """

    attention_kinds = ("hard",)
    #: running state added after the first checkpoints: an older checkpoint without it loads with its start value
    _NEWER_BUFFERS: tuple[str, ...] = NEWER_OBJECTIVE_STATE["HardAttentionObjective"]
    #: running state of the other hard-attention objective that a checkpoint may hold (dropped on loading)
    _OTHER_BUFFERS: tuple[str, ...] = ()

    def __init__(
        self,
        doubly_stochastic: float = 1.0,
        lambda_e: float = 0.002,
        baseline_decay: float = 0.9,
        semi_sampling_p: float = 0.5,
        semi_sampling_per: Literal["batch", "image", "expectation"] = "batch",
        num_samples: int = 1,
        reward_per_step: bool = True,
        lambda_e_final: float | None = None,
        entropy_anneal_steps: int = 0,
        semi_sampling_p_final: float | None = None,
        semi_sampling_anneal_steps: int = 0,
        label_smoothing: float = 0.0,
        **settings,
    ):
        super().__init__(
            doubly_stochastic,
            label_smoothing=label_smoothing,
            lambda_e=lambda_e,
            baseline_decay=baseline_decay,
            semi_sampling_p=semi_sampling_p,
            semi_sampling_per=semi_sampling_per,
            num_samples=num_samples,
            reward_per_step=reward_per_step,
            lambda_e_final=lambda_e_final,
            entropy_anneal_steps=entropy_anneal_steps,
            semi_sampling_p_final=semi_sampling_p_final,
            semi_sampling_anneal_steps=semi_sampling_anneal_steps,
            **settings,
        )
        field = "model.objective."
        if semi_sampling_per not in SEMI_SAMPLING:
            raise ConfigError(
                f"{field}semi_sampling_per: expected one of {', '.join(SEMI_SAMPLING)}, got {semi_sampling_per!r}"
            )
        for name, value in (("semi_sampling_p", semi_sampling_p), ("semi_sampling_p_final", semi_sampling_p_final)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0
            ):
                raise ConfigError(f"{field}{name}: expected a probability in [0, 1], got {value!r}")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ConfigError(f"{field}num_samples: expected an integer >= 1, got {num_samples!r}")
        if semi_sampling_per == "expectation" and num_samples > 1:
            raise ConfigError(
                f"{field}num_samples: semi_sampling_per expectation takes one location sample per caption "
                f"(got {num_samples})"
            )
        check_steps(field + "entropy_anneal_steps", entropy_anneal_steps)
        check_steps(field + "semi_sampling_anneal_steps", semi_sampling_anneal_steps)
        if lambda_e_final is not None and lambda_e_final < 0:
            raise ConfigError(f"{field}lambda_e_final: expected a number >= 0, got {lambda_e_final!r}")
        self.lambda_e, self.baseline_decay = lambda_e, baseline_decay
        self.semi_sampling_p, self.semi_sampling_per = semi_sampling_p, semi_sampling_per
        self.num_samples, self.reward_per_step = num_samples, reward_per_step
        self.lambda_e_final, self.entropy_anneal_steps = lambda_e_final, entropy_anneal_steps
        self.semi_sampling_p_final, self.semi_sampling_anneal_steps = semi_sampling_p_final, semi_sampling_anneal_steps
        self.register_buffer("baseline", torch.zeros(()))  # b, the moving average of the reward
        self.register_buffer("steps_done", torch.zeros((), dtype=torch.long))  # for the schedules

    @property
    def optional_state(self) -> tuple[str, ...]:
        """What checkpoint loading may find missing (filled in), sized otherwise or left over (dropped)."""
        return self._NEWER_BUFFERS + self._OTHER_BUFFERS

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in self._NEWER_BUFFERS:
            if prefix + name not in state_dict and prefix + "baseline" in state_dict:
                state_dict[prefix + name] = getattr(self, name).clone()
        for name in self._OTHER_BUFFERS:  # e.g. a Gumbel run's REINFORCE buffers at their start values
            state_dict.pop(prefix + name, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ schedules
    # (the step count is read from the device only when a schedule is set: the static-shape step
    # reads nothing back otherwise)
    def current_lambda_e(self) -> float:
        if self.lambda_e_final is None or self.entropy_anneal_steps <= 0:
            return self.lambda_e
        return anneal(self.lambda_e, self.lambda_e_final, self.entropy_anneal_steps, int(self.steps_done))

    def current_semi_sampling_p(self) -> float:
        return float(self.semi_sampling_p_now())

    def semi_sampling_p_now(self):
        """The expected-context probability of this step: a number, or with a schedule a 0-d tensor
        computed on the device from the step count (nothing read back: a captured step replays it)."""
        return anneal(
            self.semi_sampling_p, self.semi_sampling_p_final, self.semi_sampling_anneal_steps, self.steps_done
        )

    def static_step_problem(self) -> str | None:
        if self.entropy_anneal_steps > 0 and self.lambda_e_final is not None:
            return "the entropy schedule (lambda_e_final) reads the step count on the host at every step"
        return None

    # ------------------------------------------------------------------ the semi-sampling draw
    def semi_sampled(self, features: Tensor, batch: dict) -> SemiSampled:
        """The step's rows and which of them take the expected context (features (B, L, D))."""
        captions, lengths = batch["captions"], batch["lengths"]
        both = self.semi_sampling_per == "expectation"
        if self.num_samples > 1 or both:  # several rows per caption (samples, or both kinds of context)
            k = 2 if both else self.num_samples
            features, captions, lengths = (x.repeat_interleave(k, 0) for x in (features, captions, lengths))
        B = captions.size(0)
        p_expected = self.semi_sampling_p_now()
        weight = None
        if both:  # no draw: rows 0, 2, ... the expected context (weight 2p), rows 1, 3, ... sampled (2(1 - p))
            use_expected = torch.arange(B, device=captions.device) % 2 == 0
            p = torch.as_tensor(p_expected, dtype=features.dtype, device=captions.device)
            weight = torch.where(use_expected, 2.0 * p, 2.0 * (1.0 - p))
        elif self.semi_sampling_per == "image":  # the paper: a draw per image
            use_expected = torch.rand(B, device=captions.device) < p_expected
            if self.num_samples > 1:  # one draw per caption, shared by its samples
                use_expected = use_expected.view(-1, self.num_samples)[:, :1].expand(-1, self.num_samples).reshape(-1)
        else:  # the authors' code: one draw per minibatch
            use_expected = (torch.rand((), device=captions.device) < p_expected).expand(B)
        return SemiSampled(features, captions, lengths, use_expected, weight, p_expected)

    # ------------------------------------------------------------------ running state
    def commit(self, output: ObjectiveOutput) -> dict[str, Tensor]:
        """One more step on the clock; the reward's moving average (row weights: ``state["weight"]``)."""
        self.steps_done += 1
        self.baseline.copy_(
            update_baseline(self.baseline, output.state["reward"], self.baseline_decay, output.state.get("weight"))
        )
        return {"baseline": self.baseline.clone()}
