"""Cross-entropy training: the caption NLL plus the doubly stochastic attention penalty (Eq. 14).

Conventions follow the authors' code: a caption's cost is its summed token NLL, averaged over the
captions of the batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.errors import ConfigError
from captioning.models.decoder import DecoderOutput
from captioning.objectives.base import OBJECTIVES, Objective, ObjectiveOutput


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


def caption_uniform_nll(logits: Tensor, mask: Tensor) -> Tensor:
    """Label smoothing's term per caption: the mean over the V words of -log p(w), summed over
    the caption's real steps. logits: (N, V) for the real steps of mask (B, T), in mask order, or
    (B, T, V) for every step; returns (B,)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    uniform = -F.log_softmax(logits, dim=-1).mean(-1)  # (N,) or (B, T)
    if logits.dim() == 3:
        return (uniform * mask).sum(1)
    per_step = torch.zeros(mask.shape, dtype=uniform.dtype, device=uniform.device)
    per_step[mask] = uniform
    return per_step.sum(1)


@OBJECTIVES.register("cross_entropy")
class CrossEntropy(Objective):
    """-log p(y | a) + lambda * sum_i (1 - sum_t alpha_ti)^2: soft attention's objective (Eq. 14).

    Args:
        doubly_stochastic: lambda of Eq. 14 (1 in the authors' COCO recipe; 0 switches it off).
        label_smoothing: epsilon: each word's target is 1 - epsilon on the caption's word and
            epsilon spread evenly over the V words (Szegedy et al. 2016), i.e. the word's loss is
            (1 - epsilon) * -log p(y_t) + epsilon * mean_w -log p(w). 0: the paper's loss.
        scheduled_sampling_start: the epoch scheduled sampling (Bengio et al. 2015) starts after:
            from then on, at each step of a caption the decoder reads, with probability p, the word
            it samples from its own previous output distribution instead of the caption's (no
            gradient through the sample); None: always the caption's (the paper's teacher forcing).
            As ruotianluo/ImageCaptioning.pytorch: in epoch e > start, p = min(increase_prob *
            ((e - start) // increase_every), max_prob). Soft attention (either placement).
        scheduled_sampling_increase_every: epochs between two increases of p.
        scheduled_sampling_increase_prob: the increase of p each time.
        scheduled_sampling_max_prob: p's ceiling.
    """

    attention_kinds = ("soft",)

    def __init__(
        self,
        doubly_stochastic: float = 1.0,
        label_smoothing: float = 0.0,
        scheduled_sampling_start: int | None = None,
        scheduled_sampling_increase_every: int = 5,
        scheduled_sampling_increase_prob: float = 0.05,
        scheduled_sampling_max_prob: float = 0.25,
        **settings,
    ):
        super().__init__(
            doubly_stochastic=doubly_stochastic,
            label_smoothing=label_smoothing,
            scheduled_sampling_start=scheduled_sampling_start,
            scheduled_sampling_increase_every=scheduled_sampling_increase_every,
            scheduled_sampling_increase_prob=scheduled_sampling_increase_prob,
            scheduled_sampling_max_prob=scheduled_sampling_max_prob,
            **settings,
        )
        field = "model.objective."
        if not (_finite(doubly_stochastic) and doubly_stochastic >= 0):
            raise ConfigError(f"{field}doubly_stochastic: expected a number >= 0, got {doubly_stochastic!r}")
        if not (_finite(label_smoothing) and 0 <= label_smoothing < 1):
            raise ConfigError(f"{field}label_smoothing: expected a number in [0, 1), got {label_smoothing!r}")
        for name, value, low in (
            ("scheduled_sampling_start", scheduled_sampling_start, 0),
            ("scheduled_sampling_increase_every", scheduled_sampling_increase_every, 1),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"{field}{name}: expected an integer >= {low}, got {value!r}")
        for name, value in (
            ("scheduled_sampling_increase_prob", scheduled_sampling_increase_prob),
            ("scheduled_sampling_max_prob", scheduled_sampling_max_prob),
        ):
            if not (_finite(value) and 0 <= value <= 1):
                raise ConfigError(f"{field}{name}: expected a probability in [0, 1], got {value!r}")
        if scheduled_sampling_start is not None and "soft" not in self.attention_kinds:
            raise ConfigError(
                f"{field}scheduled_sampling_start: scheduled sampling trains soft attention only "
                f"(CrossEntropy), not {type(self).__name__}"
            )
        self.doubly_stochastic, self.label_smoothing = doubly_stochastic, label_smoothing
        self.sampling = (
            scheduled_sampling_start,
            scheduled_sampling_increase_every,
            scheduled_sampling_increase_prob,
            scheduled_sampling_max_prob,
        )
        self.sample_prob = 0.0  #: this epoch's scheduled-sampling probability (start_epoch sets it)

    def sampling_prob(self, epoch: int) -> float:
        """Scheduled sampling's p in ``epoch`` (0-based): 0 up to the start epoch, then rising."""
        start, every, increase, ceiling = self.sampling
        if start is None or epoch <= start:
            return 0.0
        return min(increase * ((epoch - start) // every), ceiling)

    def start_epoch(self, epoch: int) -> None:
        """The schedule's clock: called when each training epoch starts (training/schedules.py: EpochClock)."""
        self.sample_prob = self.sampling_prob(epoch)

    def likelihood_terms(
        self, out: DecoderOutput, captions: Tensor, weight: Tensor | None = None
    ) -> tuple[Tensor, Tensor, dict]:
        """(loss, log p(y | a) per caption (B,), logs) of a teacher-forced pass over ``captions`` (B, T + 1);
        ``weight`` (B,): row weights of the loss (None: every row 1). With label smoothing the loss's
        word term is smoothed; log p(y | a) and the logged NLL are the plain ones."""
        log_likelihood = caption_log_likelihood(out.logits, captions[:, 1:], out.mask)  # (B,)
        fit = log_likelihood  # the term the loss maximises
        if self.label_smoothing:
            eps = self.label_smoothing
            fit = (1.0 - eps) * log_likelihood - eps * caption_uniform_nll(out.logits, out.mask)
        alphas = out.alphas if out.head_alphas is None else out.head_alphas  # per head with several heads
        per_row_penalty = doubly_stochastic_penalty(alphas, out.mask)  # (B,)
        penalty = per_row_penalty.mean()
        if weight is None:
            loss = -fit.mean() + self.doubly_stochastic * penalty
        else:
            loss = (weight * (self.doubly_stochastic * per_row_penalty - fit)).mean()
        logs = {"nll_per_token": -log_likelihood.sum() / out.mask.sum(), "attention_penalty": penalty}
        return loss, log_likelihood, logs

    def static_step_problem(self) -> str | None:
        if self.sampling[0] is not None:
            return "scheduled sampling draws words on the host's schedule and samples inside the pass"
        return None

    def forward(self, model, features: Tensor, batch: dict, static: bool = False) -> ObjectiveOutput:
        captions = batch["captions"]
        sampled = {"sample_prob": self.sample_prob} if self.sample_prob > 0 else {}  # the default passes at p = 0
        out = model(features, captions, batch["lengths"], static=static, **sampled)
        loss, _, logs = self.likelihood_terms(out, captions)
        if self.sampling[0] is not None:
            logs["scheduled_sampling_p"] = torch.tensor(self.sample_prob)
        return ObjectiveOutput(loss, captions.size(0), logs)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
