"""Hard attention trained by straight-through Gumbel-softmax: NOT the paper's estimator.

The location is drawn by straight-through Gumbel-softmax (``glimpse(mode="gumbel")``, Jang et al.
2017): the forward pass reads one location, the backward pass differentiates the tempered softmax
(biased, low variance). The loss is the caption NLL through those locations, Eq. 14's penalty and
the entropy bonus; there is no REINFORCE term and no baseline. The temperature goes from
``gumbel_temperature`` to ``gumbel_temperature_final`` geometrically over ``gumbel_anneal_steps``.
The semi-sampling draw and the other schedules are the REINFORCE objective's (hard.py).

Configs and checkpoints may also name it as ``HardAttentionReinforce`` with ``estimator: gumbel``
(its earlier spelling, see reinforce.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from captioning.compat import GUMBEL_DROPPED_STATE
from captioning.errors import ConfigError
from captioning.models.decoder import GLIMPSES, Glimpse, expected_context
from captioning.objectives.base import OBJECTIVES, ObjectiveOutput
from captioning.objectives.hard import HardAttentionObjective, anneal, caption_reward, check_steps, weighted_sum_mean


@GLIMPSES.register("gumbel")
def gumbel_glimpse(alpha: Tensor, features: Tensor, use_expected, generator, beams: int, temperature: float) -> Glimpse:
    """The decoder's attention mode "gumbel": straight-through Gumbel-softmax (Jang et al. 2017), one
    location forward (a one-hot weight vector), the gradient of softmax((log alpha + g) / temperature)
    backward. alpha (N, L), features (B, L, D) -> the glimpse."""
    log_alpha = torch.log(alpha.clamp_min(1e-12))
    u = torch.rand(alpha.shape, device=alpha.device, dtype=torch.float32, generator=generator)
    gumbel = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))
    soft = torch.softmax((log_alpha + gumbel.to(log_alpha.dtype)) / temperature, dim=-1)
    location = soft.detach().argmax(dim=-1)  # s_t ~ Cat(alpha_t)
    hard = torch.zeros_like(soft).scatter_(1, location.unsqueeze(1), 1.0)
    context = expected_context(hard + (soft - soft.detach()), features, beams)  # a_{s_t} forward
    log_prob = log_alpha.gather(1, location.unsqueeze(1)).squeeze(1)
    entropy = -(alpha * log_alpha).sum(-1)
    if use_expected is not None:
        context = torch.where(use_expected.unsqueeze(1), expected_context(alpha, features, beams), context)
        log_prob = log_prob.masked_fill(use_expected, 0.0)
    return Glimpse(context, alpha, location, log_prob, entropy)


@OBJECTIVES.register("gumbel")
class HardAttentionGumbel(HardAttentionObjective):
    """Hard attention with straight-through Gumbel-softmax locations (not the paper's estimator).

    Args:
        doubly_stochastic: lambda of Eq. 14, as for soft attention.
        lambda_e: weight of the entropy bonus (0.002).
        baseline_decay: decay of the reward's moving average (logged as ``baseline``; nothing is subtracted).
        semi_sampling_p, semi_sampling_per, num_samples: the semi-sampling draw, as HardAttentionReinforce's.
        reward_per_step: the logged reward is the caption's mean token log-likelihood (true) or its sum.
        lambda_e_final, entropy_anneal_steps: the entropy bonus's schedule (None / 0: constant lambda_e).
        gumbel_temperature: the Gumbel-softmax temperature.
        gumbel_temperature_final, gumbel_anneal_steps: its geometric schedule (None / 0: constant).
        semi_sampling_p_final, semi_sampling_anneal_steps: semi_sampling_p's schedule (None / 0: constant).
    """

    #: a checkpoint of ``HardAttentionReinforce(estimator="gumbel")`` also holds REINFORCE's running
    #: state, never updated by this estimator: dropped on loading
    _OTHER_BUFFERS = GUMBEL_DROPPED_STATE

    def __init__(
        self,
        gumbel_temperature: float = 1.0,
        gumbel_temperature_final: float | None = None,
        gumbel_anneal_steps: int = 0,
        **settings,
    ):
        """``settings``: the options both hard-attention objectives have (:class:`HardAttentionObjective`)."""
        super().__init__(
            gumbel_temperature=gumbel_temperature,
            gumbel_temperature_final=gumbel_temperature_final,
            gumbel_anneal_steps=gumbel_anneal_steps,
            **settings,
        )
        for name, value in (
            ("gumbel_temperature", gumbel_temperature),
            ("gumbel_temperature_final", gumbel_temperature_final),
        ):
            if value is not None and not value > 0:
                raise ConfigError(f"model.objective.{name}: expected a number > 0, got {value!r}")
        check_steps("model.objective.gumbel_anneal_steps", gumbel_anneal_steps)
        self.gumbel_temperature, self.gumbel_temperature_final = gumbel_temperature, gumbel_temperature_final
        self.gumbel_anneal_steps = gumbel_anneal_steps

    def current_temperature(self) -> float:
        if self.gumbel_temperature_final is None or self.gumbel_anneal_steps <= 0:
            return self.gumbel_temperature
        return anneal(
            self.gumbel_temperature,
            self.gumbel_temperature_final,
            self.gumbel_anneal_steps,
            int(self.steps_done),
            geometric=True,
        )

    def static_step_problem(self) -> str | None:
        if super().static_step_problem():
            return super().static_step_problem()
        if self.gumbel_anneal_steps > 0 and self.gumbel_temperature_final is not None:
            return "the Gumbel temperature schedule reads the step count on the host at every step"
        return None

    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        rows = self.semi_sampled(features, batch)
        weight, temperature = rows.weight, self.current_temperature()
        out = model(
            rows.features,
            rows.captions,
            rows.lengths,
            mode="gumbel",
            use_expected=rows.use_expected,
            temperature=temperature,
            static=static,
        )
        loss, log_likelihood, logs = self.likelihood_terms(out, rows.captions, weight)
        mask = out.mask
        entropy = (out.entropies * mask).sum() / mask.sum().clamp(min=1)
        loss = loss - self.current_lambda_e() * weighted_sum_mean((out.entropies * mask).sum(1), weight)
        reward = caption_reward(log_likelihood, mask, self.reward_per_step)
        logs.update(
            reward=reward.mean(),
            entropy=entropy,
            temperature=torch.tensor(temperature),
            expected_fraction=rows.use_expected.float().mean(),
        )
        state = {"reward": reward, **({} if weight is None else {"weight": weight})}
        return ObjectiveOutput(loss, rows.captions.size(0), logs, state=state)
