"""How captions are generated: :class:`GenerationConfig`, with the names of Hugging Face's
``generate``, and the words a caption should not end with.

Kept apart from search.py and free of torch, so that the ONNX captioner (onnx_captioner.py), which
runs without PyTorch, takes the same settings with the same checks.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Union

from captioning.errors import ConfigError
from captioning.models import ATTENTION_MODES
from captioning.vocab import Vocabulary

#: Words a caption should not end with ("a man riding a", "a dog with"): articles, prepositions and
#: conjunctions, but not those that also end captions as adverbs ("up", "down", "out", "off",
#: "over", "by", "inside", "behind", "around"). Self-critical training is known to produce such
#: endings (a cut caption keeps most of its CIDEr); ``GenerationConfig.forbid_bad_endings`` forbids them.
BAD_ENDINGS = frozenset("""
    a an the
    of in on at to for with from into onto upon near among between across against during toward towards
    via within without under beneath beside than per
    and or but nor because although though whereas unless whether
""".split())


def bad_ending_ids(vocab: Vocabulary) -> tuple[int, ...]:
    """The ids of the vocabulary's words in :data:`BAD_ENDINGS`."""
    return tuple(sorted(vocab.stoi[w] for w in BAD_ENDINGS if w in vocab.stoi))


@dataclass
class GenerationConfig:
    """How captions are generated, with the names of Hugging Face's ``generate``.

    Args:
        num_beams: beams per image (1: greedy decoding).
        max_new_tokens: the longest caption, in tokens (EOS included).
        length_penalty: beam scores are the summed log-probabilities divided by length ** this.
        do_sample: draw each word from the model's distribution instead of taking the best (one beam only).
        temperature: divides the log-probabilities before sampling.
        top_k: sample among the k likeliest words only (0: all).
        attention_mode: how a hard-attention model picks its context: "expected" (the expected
            context, as the authors' caption script), "argmax" (the likeliest location) or
            "sample" (a sampled location). Soft-attention models always use the expected context.
        attention_temperature: a hard-attention model decoding with the expected context takes it
            under softmax(log alpha / attention_temperature): 1 is the expected context, below 1
            sharpens it towards the likeliest location's (towards "argmax" as it nears 0). A hard
            model's decoder, trained on sampled locations for part of its captions, can score better
            with a sharper context (docs/studies/HARD_ATTENTION.md); choose it on the validation split.
            Soft-attention models, and the modes "argmax" and "sample", ignore it.
        num_return_sequences: the best beams to return for each image (at most num_beams).
        forbid_bad_endings: never end a caption after an article, preposition or conjunction
            (:data:`BAD_ENDINGS`; EOS gets probability 0 after them). A caption that reaches
            max_new_tokens still stops there.
        location_samples: K > 1 decodes each image K times with sampled locations (hard
            attention; attention_mode is then "sample") and keeps the caption of the best score
            (:func:`captioning.decoding.search.best_of_k`). Soft-attention models ignore it.
        cuda_graphs: on a CUDA device, decode with each step captured as a CUDA graph per (batch,
            beams) shape and replayed (decoding/loops.py: the same captions; sampling is not
            captured); elsewhere the same fixed-shape loop runs without capture.
        num_beam_groups: diverse beam search (Vijayakumar et al. 2016) when > 1: the num_beams beams
            form this many groups of num_beams / num_beam_groups, searched in turn at each step; a
            group's candidates lose ``diversity_penalty`` times the number of times each word was
            chosen at this step by the groups before it (Hugging Face's Hamming diversity; the
            penalty enters the beam scores, as there).
        diversity_penalty: the penalty above (> 0 with groups, 0 without).
        no_repeat_ngram_size: n > 0: a word that would complete an n-gram already in the caption
            gets probability 0 (3: ruotianluo's block_trigrams).
        repetition_penalty: Hugging Face's (CTRL, Keskar et al. 2019): the scores of words already
            in the caption are divided by it where positive and multiplied where negative. Applied to
            the log-probabilities (all <= 0): a word already generated has its log p multiplied by
            the penalty (> 1 discourages repeats), without renormalising, as Hugging Face's beam
            search processes log-probabilities; the scores add the processed values.
        top_p: nucleus sampling (with do_sample): draw among the smallest set of likeliest words
            whose probability reaches top_p (at least one word); 1 keeps every word.
        min_new_tokens: EOS is forbidden before this many words.
        suppress_tokens: token ids or words (e.g. "<unk>") never generated. Words become ids with
            :meth:`resolve_tokens` (the searches take ids).

    Every processed score (penalties, bans) is applied to the decoder's log-probabilities in the
    order of Hugging Face's processors: repetition penalty, n-gram blocking, min_new_tokens,
    suppressed tokens, bad endings; sampling then applies temperature, top_k, top_p.
    """

    num_beams: int = 1
    max_new_tokens: int = 30
    length_penalty: float = 1.0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    attention_mode: Literal["expected", "argmax", "sample"] = "expected"
    attention_temperature: float = 1.0
    num_return_sequences: int = 1
    forbid_bad_endings: bool = False
    location_samples: int = 1
    cuda_graphs: bool = False
    num_beam_groups: int = 1
    diversity_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    top_p: float = 1.0
    min_new_tokens: int = 0
    suppress_tokens: tuple[Union[int, str], ...] = ()

    def __post_init__(self):
        for field, least in (("num_beams", 1), ("max_new_tokens", 1), ("top_k", 0), ("num_return_sequences", 1),
                             ("location_samples", 1), ("num_beam_groups", 1), ("no_repeat_ngram_size", 0),
                             ("min_new_tokens", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{field}: expected an integer >= {least}, got {value!r}")
        for field in ("temperature", "attention_temperature", "repetition_penalty", "top_p"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
                raise ConfigError(f"{field}: expected a number > 0, got {value!r}")
        value = self.diversity_penalty
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
            raise ConfigError(f"diversity_penalty: expected a finite number >= 0, got {value!r}")
        if self.top_p > 1:
            raise ConfigError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        self._check_suppress_tokens()
        if self.attention_mode not in ATTENTION_MODES:
            raise ConfigError(f"attention_mode: expected one of {', '.join(ATTENTION_MODES)}, got {self.attention_mode!r}")
        if self.do_sample and self.num_beams > 1:
            raise ConfigError("do_sample works with one beam: set num_beams 1 to sample, or do_sample false for beam search")
        if self.num_return_sequences > self.num_beams:
            raise ConfigError(f"num_return_sequences ({self.num_return_sequences}) cannot exceed num_beams ({self.num_beams})")
        if self.num_beams % self.num_beam_groups:
            raise ConfigError(f"num_beam_groups ({self.num_beam_groups}) must divide num_beams ({self.num_beams})")
        if self.num_beam_groups > 1 and self.do_sample:
            raise ConfigError("num_beam_groups (diverse beam search) does not sample: set do_sample false")
        if self.num_beam_groups > 1 and self.diversity_penalty == 0:
            raise ConfigError("num_beam_groups > 1 needs diversity_penalty > 0 (otherwise the groups are the same beams)")
        if self.diversity_penalty > 0 and self.num_beam_groups == 1:
            raise ConfigError("diversity_penalty applies between beam groups: set num_beam_groups > 1 (dividing num_beams)")
        if self.top_p < 1 and not self.do_sample:
            raise ConfigError(f"top_p ({self.top_p}) applies to sampling: set do_sample true (and num_beams 1)")
        if self.min_new_tokens >= self.max_new_tokens:
            raise ConfigError(f"min_new_tokens ({self.min_new_tokens}) must be below max_new_tokens ({self.max_new_tokens}): "
                              "a caption needs room for EOS")

    def _check_suppress_tokens(self) -> None:
        tokens = self.suppress_tokens
        if isinstance(tokens, (str, int)):
            tokens = (tokens,)
        if not isinstance(tokens, (list, tuple)):
            raise ConfigError(f"suppress_tokens: expected a list of token ids or words, got {tokens!r}")
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, (int, str)) or (isinstance(t, int) and t < 0) or t == "":
                raise ConfigError(f"suppress_tokens: expected token ids >= 0 or words, got {t!r}")
            if t in (Vocabulary.eos_id, Vocabulary.pad_id, Vocabulary.EOS, Vocabulary.PAD):
                raise ConfigError(f"suppress_tokens: {t!r} cannot be suppressed (captions end with it); "
                                  "min_new_tokens sets a least length")
        self.suppress_tokens = tuple(tokens)

    def resolve_tokens(self, vocab: Vocabulary) -> "GenerationConfig":
        """This config with ``suppress_tokens`` as ids of ``vocab`` (a word it lacks, or an id
        beyond it, is a one-line ConfigError)."""
        if not self.suppress_tokens or all(isinstance(t, int) for t in self.suppress_tokens):
            ids = self.suppress_tokens
        else:
            ids = []
            for t in self.suppress_tokens:
                if isinstance(t, str) and t not in vocab.stoi:
                    raise ConfigError(f"suppress_tokens: {t!r} is not a word of the model's vocabulary")
                ids.append(vocab.stoi[t] if isinstance(t, str) else t)
            ids = tuple(ids)
        beyond = [t for t in ids if t >= len(vocab)]
        if beyond:
            raise ConfigError(f"suppress_tokens: id {beyond[0]} is beyond the vocabulary ({len(vocab)} tokens)")
        return dataclasses.replace(self, suppress_tokens=tuple(ids)) if ids != self.suppress_tokens else self

    def one_beam(self) -> "GenerationConfig":
        """This config with one beam, one returned sequence and no beam groups (a captioner's default)."""
        return dataclasses.replace(self, num_beams=1, num_return_sequences=1, num_beam_groups=1, diversity_penalty=0.0)

    def replace(self, **changes) -> "GenerationConfig":
        """A copy with the given fields changed; fields given as None keep their value."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
