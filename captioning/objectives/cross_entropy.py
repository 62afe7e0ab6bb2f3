"""Cross-entropy training: the caption NLL plus the doubly stochastic attention penalty (Eq. 14).

Conventions follow the authors' code: a caption's cost is its summed token NLL, averaged over the
captions of the batch.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.errors import ConfigError
from captioning.models.decoder import DecoderOutput
from captioning.objectives.base import Objective, ObjectiveOutput


def caption_log_likelihood(logits: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
    """log p(y | a) per caption, summed over its real steps.

    logits: (N, V) for the N real steps of mask (B, T), in mask order, or (B, T, V) for every
    step (the static-shape pass: padded steps are masked here, with no host synchronisation);
    targets: (B, T). Returns (B,).
    """
    if logits.dtype in (torch.float16, torch.bfloat16):  # the loss in float32 (float64 stays float64)
        logits = logits.float()
    if logits.dim() == 3:
        token_ll = -F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        return (token_ll.view(targets.shape) * mask).sum(1)
    token_ll = -F.cross_entropy(logits, targets[mask], reduction="none")  # (N,)
    per_step = torch.zeros(mask.shape, dtype=token_ll.dtype, device=token_ll.device)
    per_step[mask] = token_ll
    return per_step.sum(1)  # (B, T) -> (B,)


def doubly_stochastic_penalty(alphas: Tensor, mask: Tensor) -> Tensor:
    """Eq. 14's regulariser sum_i (1 - sum_t alpha_ti)^2, per image, over real steps only.

    alphas: (B, T, L), or (B, T, heads, L) for multi-head attention (the term of each head,
    averaged over the heads); mask: (B, T). Summed over the L locations (not averaged), returns (B,).
    """
    if alphas.dim() == 4:
        coverage = (alphas * mask[:, :, None, None]).sum(1)  # (B, heads, L)
        return ((1.0 - coverage) ** 2).sum(-1).mean(1)
    coverage = (alphas * mask.unsqueeze(-1)).sum(1)  # (B, T, L) -> (B, L): sum_t alpha_ti
    return ((1.0 - coverage) ** 2).sum(-1)


class CrossEntropy(Objective):
    """-log p(y | a) + lambda * sum_i (1 - sum_t alpha_ti)^2: soft attention's objective (Eq. 14).

    Args:
        doubly_stochastic: lambda of Eq. 14 (1 in the authors' COCO recipe; 0 switches it off).
    """

    attention_kinds = ("soft",)

    def __init__(self, doubly_stochastic: float = 1.0, **settings):
        super().__init__(doubly_stochastic=doubly_stochastic, **settings)
        if doubly_stochastic < 0:
            raise ConfigError(f"model.objective.doubly_stochastic: expected a number >= 0, got {doubly_stochastic!r}")
        self.doubly_stochastic = doubly_stochastic

    def likelihood_terms(self, out: DecoderOutput, captions: Tensor,
                         weight: Optional[Tensor] = None) -> tuple[Tensor, Tensor, dict]:
        """(loss, log p(y | a) per caption (B,), logs) of a teacher-forced pass over ``captions`` (B, T + 1);
        ``weight`` (B,): row weights of the loss (None: every row 1)."""
        log_likelihood = caption_log_likelihood(out.logits, captions[:, 1:], out.mask)  # (B,)
        alphas = out.alphas if out.head_alphas is None else out.head_alphas  # per head with several heads
        per_row_penalty = doubly_stochastic_penalty(alphas, out.mask)  # (B,)
        penalty = per_row_penalty.mean()
        if weight is None:
            loss = -log_likelihood.mean() + self.doubly_stochastic * penalty
        else:
            loss = (weight * (self.doubly_stochastic * per_row_penalty - log_likelihood)).mean()
        logs = {"nll_per_token": -log_likelihood.sum() / out.mask.sum(), "attention_penalty": penalty}
        return loss, log_likelihood, logs

    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        captions = batch["captions"]
        out = model(features, captions, batch["lengths"], static=static)
        loss, _, logs = self.likelihood_terms(out, captions)
        return ObjectiveOutput(loss, captions.size(0), logs)
