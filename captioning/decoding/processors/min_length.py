"""``min_new_tokens``: captions of at least N words (EOS is forbidden before)."""

from __future__ import annotations

import numpy as np

from captioning.decoding.options import option
from captioning.decoding.processors.base import EOS, PROCESSORS, Processor


@PROCESSORS.register("min_new_tokens")
class MinNewTokens(Processor):
    """EOS at -inf in the rows with fewer than ``min_new_tokens`` tokens."""

    options = {
        "min_new_tokens": option(0, "captions of at least N words (EOS is forbidden before)", min=0, metavar="N")
    }

    @classmethod
    def relation_problem(cls, config, say):
        if config.min_new_tokens >= config.max_new_tokens:
            return (
                f"{say('min_new_tokens')} ({config.min_new_tokens}) must be below {say('max_new_tokens')} "
                f"({config.max_new_tokens}): a caption needs room for EOS"
            )
        return None

    def __init__(self, config, context):
        super().__init__(config, context)
        self.min_new = config.min_new_tokens

    def __call__(self, logp, previous, lengths, prefix):
        logp[:, EOS] = logp[:, EOS].masked_fill(lengths < self.min_new, float("-inf"))
        return logp

    def numpy(self, logp, previous, lengths, prefix):
        logp[lengths < self.min_new, EOS] = -np.inf
        return logp
