"""The processing of the decoder's log-probabilities at each search step: one file per logits
processor, registered in :data:`PROCESSORS` (base.py: the ``Processor`` contract and the chain a
search applies), and sampling a word (sampling.py). The built-in ones apply in Hugging Face's
order: repetition penalty, n-gram blocking, min_new_tokens, suppressed tokens, bad endings; the
forced prefix last. A plugin's processor registers from its own file (CAPTIONING_PLUGINS) and
applies after the built-in ones, before the prefix."""

from captioning.decoding.processors.base import PROCESSORS, Context, LogitsProcessor, Processor, extend_prefix

# isort: off
# The built-in processors register as they are imported: in the order they apply (the prefix last).
from captioning.decoding.processors.repetition import RepetitionPenalty
from captioning.decoding.processors.ngrams import NoRepeatNgram, ngram_bans
from captioning.decoding.processors.min_length import MinNewTokens
from captioning.decoding.processors.suppress import SuppressTokens
from captioning.decoding.processors.bad_endings import BAD_ENDINGS, BadEndings, bad_ending_ids
from captioning.decoding.processors.prefix import ForcedPrefix, force_start, prefix_ids

# isort: on
from captioning.decoding.processors.sampling import sample_token, top_p_filter

__all__ = [
    "BAD_ENDINGS",
    "PROCESSORS",
    "BadEndings",
    "Context",
    "ForcedPrefix",
    "LogitsProcessor",
    "MinNewTokens",
    "NoRepeatNgram",
    "Processor",
    "RepetitionPenalty",
    "SuppressTokens",
    "bad_ending_ids",
    "extend_prefix",
    "force_start",
    "ngram_bans",
    "prefix_ids",
    "sample_token",
    "top_p_filter",
]
