"""``repetition_penalty``: Hugging Face's (CTRL, Keskar et al. 2019) on the log-probabilities."""

from __future__ import annotations

import numpy as np

from captioning.decoding.options import option
from captioning.decoding.processors.base import PAD, PROCESSORS, Processor


@PROCESSORS.register("repetition_penalty")
class RepetitionPenalty(Processor):
    """A word already generated has its log p (<= 0) multiplied by the penalty (> 1 discourages
    repeats), without renormalising, as Hugging Face's beam search processes log-probabilities;
    the scores add the processed values."""

    options = {
        "repetition_penalty": option(
            1.0,
            "multiply the log-probability of words already in the caption by this (> 1 discourages repeats)",
            min=0,
            min_inclusive=False,
        )
    }
    needs_tokens = True

    def __init__(self, config, context):
        super().__init__(config, context)
        self.penalty = float(config.repetition_penalty)

    def __call__(self, logp, previous, lengths, prefix):
        import torch

        seen = torch.zeros_like(logp, dtype=torch.bool).scatter_(1, prefix, True)
        seen[:, PAD] = False
        return torch.where(seen, torch.where(logp < 0, logp * self.penalty, logp / self.penalty), logp)

    def numpy(self, logp, previous, lengths, prefix):
        seen = np.zeros(logp.shape, dtype=bool)
        seen[np.arange(logp.shape[0])[:, None], prefix] = True
        seen[:, PAD] = False
        penalty = np.float32(self.penalty)
        return np.where(seen, np.where(logp < 0, logp * penalty, logp / penalty), logp).astype(np.float32)
