"""``no_repeat_ngram_size``: a word that would complete an n-gram already in the caption gets
probability 0 (3: ruotianluo's block_trigrams)."""

from __future__ import annotations

import numpy as np

from captioning.decoding.options import option
from captioning.decoding.processors.base import PROCESSORS, Processor


def ngram_bans(prefix, lengths, n: int, vocab_size: int):
    """(N, V) bool: the tokens that would complete an n-gram already in each row's prefix.

    prefix (N, T): each row's tokens so far in its first ``lengths`` (N,) columns. Fixed shapes
    and no host reads, so that the step can be captured: every window of n tokens of the prefix is
    compared with the row's last n - 1 tokens."""
    import torch

    N, T = prefix.shape
    banned = torch.zeros(N, vocab_size, dtype=torch.long, device=prefix.device)
    if T < n:
        return banned.bool()
    windows = prefix.unfold(1, n, 1)  # (N, W, n), W = T - n + 1
    W = windows.size(1)
    tail = prefix.gather(
        1, (lengths.unsqueeze(1) - (n - 1) + torch.arange(n - 1, device=prefix.device)).clamp(min=0)
    )  # (N, n-1)
    match = (windows[:, :, : n - 1] == tail.unsqueeze(1)).all(-1)  # (N, W)
    in_prefix = (torch.arange(W, device=prefix.device) + n - 1).unsqueeze(0) < lengths.unsqueeze(1)
    match &= in_prefix  # the window is in the prefix
    return banned.scatter_add_(1, windows[:, :, n - 1], match.long()) > 0


@PROCESSORS.register("no_repeat_ngram_size")
class NoRepeatNgram(Processor):
    """Bans the words that would repeat an n-gram of the caption (:func:`ngram_bans`)."""

    options = {
        "no_repeat_ngram_size": option(
            0, "never repeat an n-gram of N words within a caption (3: block trigrams; 0: off)", min=0, metavar="N"
        )
    }
    needs_tokens = True

    def __init__(self, config, context):
        super().__init__(config, context)
        self.n = config.no_repeat_ngram_size

    def __call__(self, logp, previous, lengths, prefix):
        return logp.masked_fill(ngram_bans(prefix, lengths, self.n, logp.size(-1)), float("-inf"))

    def numpy(self, logp, previous, lengths, prefix):
        n = self.n
        for i in range(logp.shape[0]):
            L = int(lengths[i])
            tail = prefix[i, L - n + 1 : L].tolist() if n > 1 else []
            for j in range(L - n + 1):
                if prefix[i, j : j + n - 1].tolist() == tail:
                    logp[i, prefix[i, j + n - 1]] = -np.inf
        return logp
