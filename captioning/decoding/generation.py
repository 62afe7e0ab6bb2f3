"""How captions are generated: :class:`GenerationConfig`, with the names of Hugging Face's
``generate``, and the words a caption should not end with.

Kept apart from search.py and free of torch, so that the ONNX captioner (onnx_captioner.py), which
runs without PyTorch, takes the same settings with the same checks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

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

    def __post_init__(self):
        for field, least in (("num_beams", 1), ("max_new_tokens", 1), ("top_k", 0), ("num_return_sequences", 1),
                             ("location_samples", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"{field}: expected an integer >= {least}, got {value!r}")
        for field in ("temperature", "attention_temperature"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
                raise ConfigError(f"{field}: expected a number > 0, got {value!r}")
        if self.attention_mode not in ATTENTION_MODES:
            raise ConfigError(f"attention_mode: expected one of {', '.join(ATTENTION_MODES)}, got {self.attention_mode!r}")
        if self.do_sample and self.num_beams > 1:
            raise ConfigError("do_sample works with one beam: set num_beams 1 to sample, or do_sample false for beam search")
        if self.num_return_sequences > self.num_beams:
            raise ConfigError(f"num_return_sequences ({self.num_return_sequences}) cannot exceed num_beams ({self.num_beams})")

    def replace(self, **changes) -> "GenerationConfig":
        """A copy with the given fields changed; fields given as None keep their value."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})
