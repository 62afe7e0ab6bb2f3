"""Training objectives of the paper: the caption NLL, doubly stochastic attention and REINFORCE.

Conventions follow the authors' code: a caption's cost is its summed token NLL, averaged over the
images of the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def caption_log_likelihood(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """log p(y | a) per caption, summed over its real steps.

    logits: (N, V) for the N real steps of mask (B, T), in mask order; targets: (B, T).
    Returns (B,).
    """
    token_ll = -F.cross_entropy(logits.float(), targets[mask], reduction="none")  # (N,)
    per_step = torch.zeros(mask.shape, dtype=token_ll.dtype, device=token_ll.device)
    per_step[mask] = token_ll
    return per_step.sum(1)  # (B, T) -> (B,)


def doubly_stochastic_penalty(alphas: Tensor, mask: Tensor) -> Tensor:
    """Eq. 14's regulariser sum_i (1 - sum_t alpha_ti)^2, per image, over real steps only.

    alphas: (B, T, L); mask: (B, T). Summed over the L locations (not averaged), returns (B,).
    """
    coverage = (alphas * mask.unsqueeze(-1)).sum(1)  # (B, T, L) -> (B, L): sum_t alpha_ti
    return ((1.0 - coverage) ** 2).sum(-1)


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
    """The hard-attention learning rule of Eq. 12, as a loss to minimise.

    grad L ~ d log p(y|s,a)/dW + lambda_r (R - b) d log p(s|a)/dW + lambda_e d H[s]/dW

    log_likelihood: (B,) log p(y | s, a), summed over steps (its gradient is the first term);
    location_log_prob: (B, T) log p(s_t | a), 0 where the expected context was used;
    entropy: (B, T) H[alpha_t]; mask: (B, T) real steps; baseline: scalar b.
    The reward R is the caption's log-likelihood averaged over its real steps (the authors' code;
    ``reward_per_step=False`` uses the summed log-likelihood, for which lambda_r = 1 makes the
    estimator unbiased for the gradient of E_s[log p(y | s, a)]).
    Returns the surrogate loss -(sum of the three terms) averaged over the batch; the NLL part is
    left to the caller (it is -log_likelihood), so this loss holds only the second and third terms.
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
