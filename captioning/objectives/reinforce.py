"""Hard attention's objective: the caption NLL through sampled locations, plus REINFORCE (Eq. 12).

    grad L ~ d log p(y|s,a)/dW + lambda_r (R - b) d log p(s|a)/dW + lambda_e d H[s]/dW

The locations s_t ~ Cat(alpha_t) are sampled along each caption; with probability
``semi_sampling_p`` a caption uses the expected context instead (the paper's variance reduction,
Section 4.1); b is a moving average of the reward (saved in checkpoints).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from captioning.errors import ConfigError
from captioning.objectives.base import ObjectiveOutput
from captioning.objectives.cross_entropy import CrossEntropy


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
) -> ReinforceTerms:
    """The second and third terms of Eq. 12, as a loss to minimise.

    log_likelihood: (B,) log p(y | s, a), summed over steps (its gradient is the first term, left
    to the caller: it is -log_likelihood); location_log_prob: (B, T) log p(s_t | a), 0 where the
    expected context was used; entropy: (B, T) H[alpha_t]; mask: (B, T) real steps; baseline: scalar b.
    The reward R is the caption's log-likelihood averaged over its real steps (the authors' code;
    ``reward_per_step=False`` uses the summed log-likelihood, for which lambda_r = 1 makes the
    estimator unbiased for the gradient of E_s[log p(y | s, a)]).
    """
    steps = mask.sum(1).clamp(min=1)  # (B,)
    reward = (log_likelihood / steps if reward_per_step else log_likelihood).detach()  # (B,)
    advantage = reward - baseline
    log_p_s = (location_log_prob * mask).sum(1)  # (B,) log p(s | a) of the whole location sequence
    mean_entropy = (entropy * mask).sum() / mask.sum().clamp(min=1)
    loss = -(lambda_r * advantage * log_p_s).mean() - lambda_e * (entropy * mask).sum(1).mean()
    return ReinforceTerms(loss, reward, advantage, mean_entropy)


def update_baseline(baseline: Tensor, reward: Tensor, decay: float = 0.9) -> Tensor:
    """Exponential moving average b_k = decay * b_{k-1} + (1 - decay) * mean reward (Section 4.1)."""
    return decay * baseline + (1.0 - decay) * reward.mean().detach()


class HardAttentionReinforce(CrossEntropy):
    """Hard (stochastic) attention trained as in the paper: NLL through sampled locations + REINFORCE.

    Args:
        doubly_stochastic: lambda of Eq. 14, as for soft attention.
        lambda_r: weight of the REINFORCE term (0.1 in the authors' code).
        lambda_e: weight of the entropy bonus (0.002).
        baseline_decay: the moving-average baseline's decay (0.9).
        semi_sampling_p: probability of using the expected context instead of a sample (0.5).
        semi_sampling_per: draw that choice once per "batch" (the authors' code) or per "image" (the paper).
        num_samples: location sequences sampled per caption (each a row of the batch).
        reward_per_step: the reward is the caption's mean token log-likelihood (true, the authors'
            code) or its sum.
    """

    attention_kinds = ("hard",)

    def __init__(
        self,
        doubly_stochastic: float = 1.0,
        lambda_r: float = 0.1,
        lambda_e: float = 0.002,
        baseline_decay: float = 0.9,
        semi_sampling_p: float = 0.5,
        semi_sampling_per: Literal["batch", "image"] = "batch",
        num_samples: int = 1,
        reward_per_step: bool = True,
    ):
        super().__init__(
            doubly_stochastic, lambda_r=lambda_r, lambda_e=lambda_e, baseline_decay=baseline_decay,
            semi_sampling_p=semi_sampling_p, semi_sampling_per=semi_sampling_per, num_samples=num_samples,
            reward_per_step=reward_per_step,
        )
        if semi_sampling_per not in ("batch", "image"):
            raise ConfigError(f"model.objective.semi_sampling_per: expected 'batch' or 'image', got {semi_sampling_per!r}")
        if not 0.0 <= semi_sampling_p <= 1.0:
            raise ConfigError(f"model.objective.semi_sampling_p: expected a probability, got {semi_sampling_p!r}")
        if num_samples < 1:
            raise ConfigError(f"model.objective.num_samples: expected an integer >= 1, got {num_samples!r}")
        self.lambda_r, self.lambda_e, self.baseline_decay = lambda_r, lambda_e, baseline_decay
        self.semi_sampling_p, self.semi_sampling_per = semi_sampling_p, semi_sampling_per
        self.num_samples, self.reward_per_step = num_samples, reward_per_step
        self.register_buffer("baseline", torch.zeros(()))  # b, saved in checkpoints

    def forward(self, model, features: Tensor, batch: dict) -> ObjectiveOutput:
        captions, lengths = batch["captions"], batch["lengths"]
        if self.num_samples > 1:  # several location samples per caption: each its own row
            features, captions, lengths = (x.repeat_interleave(self.num_samples, 0) for x in (features, captions, lengths))
        B = captions.size(0)
        if self.semi_sampling_per == "image":  # the paper: a draw per image
            use_expected = torch.rand(B, device=captions.device) < self.semi_sampling_p
        else:  # the authors' code: one draw per minibatch
            use_expected = (torch.rand((), device=captions.device) < self.semi_sampling_p).expand(B)
        out = model(features, captions, lengths, mode="sample", use_expected=use_expected)
        loss, log_likelihood, logs = self.likelihood_terms(out, captions)
        terms = reinforce_loss(log_likelihood, out.location_log_probs, out.entropies, out.mask, self.baseline,
                               self.lambda_r, self.lambda_e, self.reward_per_step)
        logs.update(reward=terms.reward.mean(), advantage=terms.advantage.mean(), entropy=terms.entropy)
        return ObjectiveOutput(loss + terms.loss, B, logs, state={"reward": terms.reward})

    def commit(self, output: ObjectiveOutput) -> dict[str, Tensor]:
        self.baseline.copy_(update_baseline(self.baseline, output.state["reward"], self.baseline_decay))
        return {"baseline": self.baseline.clone()}
