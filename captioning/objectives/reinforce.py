"""Hard attention's objective: the caption NLL through sampled locations, plus REINFORCE (Eq. 12).

    grad L ~ d log p(y|s,a)/dW + lambda_r (R - b) d log p(s|a)/dW + lambda_e d H[s]/dW

The locations s_t ~ Cat(alpha_t) are sampled along each caption; with probability
``semi_sampling_p`` a caption uses the expected context instead (the paper's variance reduction,
Section 4.1); b is a moving average of the reward (saved in checkpoints). Options lower the variance
of the location-gradient term and keep the estimator the paper's (unbiased whatever the baseline, as
long as it does not depend on the sampled locations): ``num_samples`` K with ``baseline:
leave_one_out``, ``baseline: learned`` (fitted in :meth:`commit`), ``normalize_reward``,
``lambda_e_final`` / ``entropy_anneal_steps``, ``semi_sampling_per`` (batch, image or ``expectation``)
and ``semi_sampling_p_final`` / ``semi_sampling_anneal_steps``. ``label_smoothing`` applies to the
likelihood term only; the reward R stays the caption's plain log-likelihood.

The straight-through Gumbel estimator (not the paper's) is its own objective, gumbel.py's
:class:`~captioning.objectives.gumbel.HardAttentionGumbel`; a config or checkpoint that names this
class with ``estimator: gumbel`` (its earlier spelling) is read as one. What the two share (the
semi-sampling draw and its schedule, the entropy bonus, the reward's moving average) is in hard.py.

Each option, why it keeps the paper's estimator and why the reward is not smoothed: docs/TRAINING.md, "Hard attention".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from captioning.compat import NEWER_OBJECTIVE_STATE
from captioning.errors import ConfigError
from captioning.objectives.base import OBJECTIVES, ObjectiveOutput
from captioning.objectives.hard import (  # noqa: F401
    SEMI_SAMPLING,
    HardAttentionObjective,
    anneal,
    caption_reward,
    update_baseline,
    weighted_mean,
    weighted_sum_mean,
)

BASELINES = ("moving_average", "leave_one_out", "learned")
ESTIMATORS = ("reinforce", "gumbel")


@dataclass
class ReinforceTerms:
    loss: Tensor  # scalar surrogate whose gradient is the estimator
    reward: Tensor  # (B,) log p(y | s, a) per caption (mean over its steps)
    advantage: Tensor  # (B,) reward - baseline
    entropy: Tensor  # scalar mean attention entropy per step


def reinforce_loss(
    log_likelihood: Tensor,
    location_log_prob: Tensor,
    entropy: Tensor,
    mask: Tensor,
    baseline: Tensor,
    lambda_r: float = 0.1,
    lambda_e: float = 0.002,
    reward_per_step: bool = True,
    scale: Tensor | None = None,
    weight: Tensor | None = None,
) -> ReinforceTerms:
    """The second and third terms of Eq. 12, as a loss to minimise.

    Args:
        log_likelihood: (B,) log p(y | s, a), summed over steps (its gradient is the first term, left
            to the caller: it is -log_likelihood).
        location_log_prob: (B, T) log p(s_t | a), 0 where the expected context was used.
        entropy: (B, T) H[alpha_t].
        mask: (B, T) real steps.
        baseline: a scalar b or one per caption (B,), which must not depend on the caption's sampled
            locations.

    The reward R is the caption's plain log-likelihood (never label-smoothed) averaged over its
    real steps (the authors' code; ``reward_per_step=False`` uses the summed log-likelihood, for
    which lambda_r = 1 makes the estimator unbiased for the gradient of E_s[log p(y | s, a)]).
    ``scale``: the advantage is divided by it (reward normalisation; a number fixed before the step's samples). ``weight``: (B,)
    row weights of the loss (``semi_sampling_per: expectation``), None for 1.
    """
    reward = caption_reward(log_likelihood, mask, reward_per_step)  # (B,)
    advantage = reward - baseline.detach()
    if scale is not None:
        advantage = advantage / scale
    log_p_s = (location_log_prob * mask).sum(1)  # (B,) log p(s | a) of the whole location sequence
    mean_entropy = (entropy * mask).sum() / mask.sum().clamp(min=1)
    per_row = lambda_r * advantage * log_p_s + lambda_e * (entropy * mask).sum(1)
    loss = -weighted_sum_mean(per_row, weight)
    return ReinforceTerms(loss, reward, advantage, mean_entropy)


def leave_one_out_baseline(reward: Tensor, k: int) -> Tensor:
    """Each sample's baseline: the mean reward of the other k - 1 samples of its caption.

    reward: (B * k,), the k samples of a caption in consecutive rows. Returns (B * k,)."""
    if k < 2:
        raise ValueError("a leave-one-out baseline needs at least 2 samples per caption")
    r = reward.view(-1, k)  # (B, k)
    return ((r.sum(1, keepdim=True) - r) / (k - 1)).view(-1)


def location_grad_sq(
    advantage: Tensor, alphas: Tensor, locations: Tensor, location_log_prob: Tensor, mask: Tensor, lambda_r: float
) -> Tensor:
    """Mean over captions of the squared norm of the location term's gradient w.r.t. the attention scores.

    For one caption that gradient is lambda_r A (onehot(s_t) - alpha_t) at each sampled step, so its
    squared norm is lambda_r^2 A^2 sum_t (1 - 2 alpha_t,s_t + |alpha_t|^2): no autograd needed.
    Steps that took the expected context (log p = 0 exactly) add nothing. (B,), (B, T, L), (B, T) -> scalar.
    """
    sampled = mask & (location_log_prob != 0)
    a_s = alphas.gather(2, locations.unsqueeze(2)).squeeze(2)  # (B, T)
    per_step = (1.0 - 2.0 * a_s + (alphas**2).sum(2)) * sampled
    return ((lambda_r * advantage) ** 2 * per_step.sum(1)).mean()


@OBJECTIVES.register("reinforce")
class HardAttentionReinforce(HardAttentionObjective):
    """Hard (stochastic) attention trained as in the paper: NLL through sampled locations + REINFORCE.

    Args:
        doubly_stochastic: lambda of Eq. 14, as for soft attention.
        lambda_r: weight of the REINFORCE term (0.1 in the authors' code).
        lambda_e: weight of the entropy bonus (0.002).
        baseline_decay: the moving-average baseline's decay (0.9).
        semi_sampling_p: probability of using the expected context instead of a sample (0.5).
        semi_sampling_per: draw that choice once per "batch" (the authors' code) or per "image" (the paper),
            or "expectation": decode every caption both ways, the losses weighted p and 1 - p.
        num_samples: location sequences sampled per caption (each a row of the batch).
        reward_per_step: the reward is the caption's mean token log-likelihood (true, the authors'
            code) or its sum.
        baseline: "moving_average" (the paper), "leave_one_out" (needs num_samples >= 2) or
            "learned" (the moving average plus a linear function of the mean annotation vector).
        baseline_lr: the learned baseline's step size (normalised LMS, in (0, 2)).
        normalize_reward: divide the advantage by a running standard deviation of the advantages.
        label_smoothing: epsilon of the likelihood term (0: the paper's loss); the reward stays the
            plain log-likelihood (see the module's docstring).
        lambda_e_final, entropy_anneal_steps: the entropy bonus's schedule (None / 0: constant lambda_e).
        semi_sampling_p_final, semi_sampling_anneal_steps: semi_sampling_p's schedule (None / 0: constant).
        estimator, gumbel_temperature, gumbel_temperature_final, gumbel_anneal_steps: the earlier
            spelling of :class:`~captioning.objectives.gumbel.HardAttentionGumbel`, accepted so that
            configs and checkpoints that name them still parse: a config or checkpoint entry with
            ``estimator: gumbel`` is read as a HardAttentionGumbel (objectives/__init__.py:
            current_spelling). Here ``estimator`` must be "reinforce" and the gumbel settings are
            not used.
    """

    _NEWER_BUFFERS = NEWER_OBJECTIVE_STATE["HardAttentionReinforce"]

    def __init__(
        self,
        lambda_r: float = 0.1,
        baseline: Literal["moving_average", "leave_one_out", "learned"] = "moving_average",
        baseline_lr: float = 0.1,
        normalize_reward: bool = False,
        estimator: Literal["reinforce", "gumbel"] = "reinforce",
        gumbel_temperature: float = 1.0,
        gumbel_temperature_final: float | None = None,
        gumbel_anneal_steps: int = 0,
        **settings,
    ):
        """``settings``: the options both hard-attention objectives have (:class:`HardAttentionObjective`);
        ``estimator`` and ``gumbel_*`` are read for configs of earlier versions (see the class docstring)."""
        super().__init__(
            lambda_r=lambda_r, baseline=baseline, baseline_lr=baseline_lr, normalize_reward=normalize_reward, **settings
        )
        field = "model.objective."
        if estimator == "gumbel":
            raise ConfigError(
                f"{field}estimator: gumbel is the objective HardAttentionGumbel "
                "(class_path captioning.objectives.HardAttentionGumbel)"
            )
        if estimator != "reinforce":
            raise ConfigError(f"{field}estimator: expected one of {', '.join(ESTIMATORS)}, got {estimator!r}")
        if baseline not in BASELINES:
            raise ConfigError(f"{field}baseline: expected one of {', '.join(BASELINES)}, got {baseline!r}")
        if baseline == "leave_one_out" and self.num_samples < 2:
            raise ConfigError(f"{field}baseline: leave_one_out needs num_samples >= 2 (got {self.num_samples})")
        if not 0.0 < baseline_lr < 2.0:
            raise ConfigError(f"{field}baseline_lr: expected a number in (0, 2), got {baseline_lr!r}")
        self.lambda_r, self.baseline_kind = lambda_r, baseline
        self.baseline_lr, self.normalize_reward = baseline_lr, normalize_reward
        # Running state, saved in checkpoints with the weights (besides hard.py's baseline and steps_done):
        self.register_buffer("advantage_var", torch.ones(()))  # running variance of the advantage (normalize_reward)
        self.register_buffer("baseline_weight", torch.zeros(0))  # (D,) the learned baseline's w, sized on first use
        self.register_buffer("baseline_bias", torch.zeros(()))  # its c

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        weight = state_dict.get(prefix + "baseline_weight")
        if weight is not None and weight.shape != self.baseline_weight.shape:
            self.baseline_weight = self.baseline_weight.new_zeros(weight.shape)  # sized by the checkpoint
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ baselines
    def learned_baseline(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """(b(a) (B,), the input mean_i a_i (B, D)): the moving average plus w^T mean(a) + c."""
        x = features.detach().float().mean(1)  # (B, L, D) -> (B, D)
        if self.baseline_weight.numel() != x.size(1):
            self.baseline_weight = x.new_zeros(x.size(1))
        return self.baseline + x @ self.baseline_weight + self.baseline_bias, x

    def baselines(self, reward: Tensor, features: Tensor) -> tuple[Tensor, dict]:
        """b per row (B,) for the rewards (B,) of rows whose annotation vectors are ``features``."""
        if self.baseline_kind == "leave_one_out":
            return leave_one_out_baseline(reward, self.num_samples), {}
        if self.baseline_kind == "learned":
            b, x = self.learned_baseline(features)
            return b, {"baseline_input": x, "baseline_value": b}
        return self.baseline.expand_as(reward), {}

    # ------------------------------------------------------------------ the loss
    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        rows = self.semi_sampled(features, batch)
        captions, use_expected, weight, p_expected = rows.captions, rows.use_expected, rows.weight, rows.p_expected
        lambda_e = self.current_lambda_e()
        out = model(rows.features, captions, rows.lengths, mode="sample", use_expected=use_expected, static=static)
        loss, log_likelihood, logs = self.likelihood_terms(out, captions, weight)
        reward = caption_reward(log_likelihood, out.mask, self.reward_per_step)
        baseline, state = self.baselines(reward, rows.features)
        scale = self.advantage_var.sqrt().clamp(min=1e-4) if self.normalize_reward else None
        terms = reinforce_loss(
            log_likelihood,
            out.location_log_probs,
            out.entropies,
            out.mask,
            baseline,
            self.lambda_r,
            lambda_e,
            self.reward_per_step,
            scale,
            weight,
        )
        sampled = ~use_expected  # the rows whose REINFORCE term is not zero
        with torch.no_grad():
            row_advantage = terms.advantage if weight is None else terms.advantage * weight
            score_weight = self.lambda_r * row_advantage  # what multiplies d log p(s | a) per row
            if static:  # read nothing back: nan when fewer than two rows sampled
                n = sampled.sum()
                mean = (score_weight * sampled).sum() / n
                weight_var = {"reinforce_weight_var": (((score_weight - mean) ** 2) * sampled).sum() / (n - 1)}
            else:
                score_weight = score_weight[sampled]
                weight_var = {"reinforce_weight_var": score_weight.var()} if score_weight.numel() > 1 else {}
            logs.update(
                reward=terms.reward.mean(),
                advantage=terms.advantage.mean(),
                entropy=terms.entropy,
                expected_fraction=use_expected.float().mean(),
                location_grad_sq=location_grad_sq(
                    row_advantage, out.alphas, out.locations, out.location_log_probs, out.mask, self.lambda_r
                ),
                **weight_var,
            )
            if lambda_e != self.lambda_e:
                logs["lambda_e"] = torch.tensor(lambda_e)
            if isinstance(p_expected, Tensor):  # a schedule is set
                logs["semi_sampling_p"] = p_expected
        state.update(
            reward=terms.reward,
            raw_advantage=(terms.reward - baseline).detach(),
            **({} if weight is None else {"weight": weight}),
        )
        return ObjectiveOutput(loss + terms.loss, captions.size(0), logs, state=state)

    def commit(self, output: ObjectiveOutput) -> dict[str, Tensor]:
        logs = super().commit(output)  # the clock and the moving average
        state, weight = output.state, output.state.get("weight")  # row weights (semi_sampling_per: expectation)
        if "raw_advantage" in state:
            a = state["raw_advantage"]
            self.advantage_var.copy_(
                self.baseline_decay * self.advantage_var + (1 - self.baseline_decay) * weighted_mean(a**2, weight)
            )
        if "baseline_input" in state:  # one normalised-LMS step of the learned baseline towards the rewards
            x, error = state["baseline_input"], state["baseline_value"] - state["reward"]  # (B, D), (B,)
            # every mean over rows weighted as in the loss (semi_sampling_per: expectation)
            step = self.baseline_lr / (weighted_mean((x**2).sum(1), weight) + 1.0)
            self.baseline_weight.sub_(step * weighted_mean(error.unsqueeze(1) * x, weight))
            self.baseline_bias.sub_(step * weighted_mean(error, weight))
            logs["baseline_mse"] = weighted_mean(error**2, weight)
        return logs
