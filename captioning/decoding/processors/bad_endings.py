"""``forbid_bad_endings``: never end a caption on an article, preposition or conjunction."""

from __future__ import annotations

import numpy as np

from captioning.decoding.options import option
from captioning.decoding.processors.base import EOS, PROCESSORS, Processor
from captioning.errors import ConfigError
from captioning.vocab import Vocabulary

#: Words a caption should not end with ("a man riding a", "a dog with"): articles, prepositions and
#: conjunctions, but not those that also end captions as adverbs ("up", "down", "out", "off",
#: "over", "by", "inside", "behind", "around"). Self-critical training is known to produce such
#: endings (a cut caption keeps most of its CIDEr); ``GenerationConfig.forbid_bad_endings`` forbids them.
BAD_ENDINGS = frozenset(
    """
    a an the
    of in on at to for with from into onto upon near among between across against during toward towards
    via within without under beneath beside than per
    and or but nor because although though whereas unless whether
""".split()
)


def bad_ending_ids(vocab: Vocabulary) -> tuple[int, ...]:
    """The ids of the vocabulary's words in :data:`BAD_ENDINGS`."""
    return tuple(sorted(vocab.stoi[w] for w in BAD_ENDINGS if w in vocab.stoi))


@PROCESSORS.register("forbid_bad_endings")
class BadEndings(Processor):
    """EOS gets probability 0 after a word of :data:`BAD_ENDINGS`, and so do the words of
    BAD_ENDINGS at the last step max_new_tokens allows: a caption that the length limit cuts ends
    on a good word too (the search picks the best good word there, and beam search weighs it in
    the beams' scores). The ids are the decoder's ``bad_ending_ids``, which ShowAttendTell sets
    from its vocabulary (the decoder itself does not know its words)."""

    options = {
        "forbid_bad_endings": option(
            False, "never end a caption on an article, preposition or conjunction ('a', 'with', 'and'...)"
        )
    }

    def __init__(self, config, context):
        super().__init__(config, context)
        if context.bad_ending_ids is None:
            raise ConfigError(
                "forbid_bad_endings needs the model's vocabulary: decode with a ShowAttendTell (build_model, "
                "load_model), or set decoder.bad_ending_ids = bad_ending_ids(vocab)"
            )
        self.table = context.mask(context.bad_ending_ids)  # (V,) bool: after which tokens EOS is forbidden
        self.last_step = config.max_new_tokens - 1  # a row with this many tokens chooses its last word

    def __call__(self, logp, previous, lengths, prefix):
        last = lengths == self.last_step  # (N,): the length limit ends the caption with this word
        logp = logp.masked_fill(last.unsqueeze(1) & self.table, float("-inf"))
        logp[:, EOS] = logp[:, EOS].masked_fill(self.table[previous], float("-inf"))
        return logp

    def numpy(self, logp, previous, lengths, prefix):
        logp[np.ix_(lengths == self.last_step, self.table)] = -np.inf
        logp[self.table[previous], EOS] = -np.inf
        return logp
