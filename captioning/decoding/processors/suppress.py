"""``suppress_tokens``: words or token ids never generated, e.g. ``<unk>``."""

from __future__ import annotations

import numpy as np

from captioning.decoding.options import option
from captioning.decoding.processors.base import PROCESSORS, Processor
from captioning.errors import ConfigError
from captioning.vocab import Vocabulary

#: what cannot be suppressed: captions end with EOS (and finished rows continue with PAD)
ENDINGS = (Vocabulary.eos_id, Vocabulary.pad_id, Vocabulary.EOS, Vocabulary.PAD)


def _endings_problem(tokens: tuple) -> str | None:
    for t in tokens:
        if t in ENDINGS:
            return f"{t!r} cannot be suppressed (captions end with it); min_new_tokens sets a least length"
    return None


@PROCESSORS.register("suppress_tokens")
class SuppressTokens(Processor):
    """The suppressed tokens at -inf in every row. Words become ids with
    ``GenerationConfig.resolve_tokens`` (:meth:`resolve`; the searches take ids)."""

    options = {
        "suppress_tokens": option(
            (),
            "words or token ids never generated, e.g. '<unk>' (comma-separated on the command line)",
            metavar="TOKENS",
            validate=_endings_problem,
        )
    }

    @classmethod
    def resolve(cls, config, vocab):
        tokens = config.suppress_tokens
        if not tokens or all(isinstance(t, int) for t in tokens):
            ids = tokens
        else:
            ids = []
            for t in tokens:
                if isinstance(t, str) and t not in vocab.stoi:
                    raise ConfigError(f"suppress_tokens: {t!r} is not a word of the model's vocabulary")
                ids.append(vocab.stoi[t] if isinstance(t, str) else t)
            ids = tuple(ids)
        beyond = [t for t in ids if t >= len(vocab)]
        if beyond:
            raise ConfigError(f"suppress_tokens: id {beyond[0]} is beyond the vocabulary ({len(vocab)} tokens)")
        return {"suppress_tokens": tuple(ids)} if ids != tokens else {}

    def __init__(self, config, context):
        super().__init__(config, context)
        words = [t for t in config.suppress_tokens if not isinstance(t, int)]
        if words:
            raise ConfigError(
                f"suppress_tokens: words ({words[0]!r}) need the model's vocabulary: pass config.resolve_tokens(vocab)"
            )
        beyond = [t for t in config.suppress_tokens if t >= context.vocab_size]
        if beyond:
            raise ConfigError(f"suppress_tokens: id {beyond[0]} is beyond the vocabulary ({context.vocab_size} tokens)")
        self.table = context.mask(config.suppress_tokens)  # (V,) bool

    def __call__(self, logp, previous, lengths, prefix):
        return logp.masked_fill(self.table, float("-inf"))

    def numpy(self, logp, previous, lengths, prefix):
        logp[:, self.table] = -np.inf
        return logp
