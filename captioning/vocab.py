"""The vocabulary that maps tokens to ids and back, and the tokenizer that made the tokens.

Ids 0-3 are the special tokens ``<pad>``, ``<start>``, ``<end>`` and ``<unk>``; the tokens follow,
most frequent first (ties alphabetical), so that a vocabulary built from the same captions is
always the same. Tokens seen fewer than ``min_freq`` times become ``<unk>`` (paper: about 10,000
words for COCO with a threshold of ~5). The vocabulary holds its tokenizer (captioning/tokenizers.py),
which turns generated tokens back into text; a stored vocabulary that names none used ``words``,
and one that records no ``tokenizer_version`` split its words as nltk 3.10.4 did (captioning/compat.py).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from captioning.compat import UNRECORDED_TOKENIZER, UNRECORDED_TOKENIZER_VERSION
from captioning.errors import ConfigError
from captioning.files import atomic_write_json, read_json_file
from captioning.tokenizers import DEFAULT_TOKENIZER, TOKENIZERS, Tokenizer, build_tokenizer


class Vocabulary:
    """Token <-> id mapping with the four special tokens at ids 0-3, and the tokenizer of the tokens
    (a :class:`~captioning.tokenizers.Tokenizer` or its registered name)."""

    PAD, BOS, EOS, UNK = "<pad>", "<start>", "<end>", "<unk>"
    SPECIALS = (PAD, BOS, EOS, UNK)
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(
        self, itos: Sequence[str], min_freq: int | None = None, tokenizer: str | Tokenizer = DEFAULT_TOKENIZER
    ):
        itos = list(itos)
        if tuple(itos[:4]) != self.SPECIALS:
            raise ConfigError(f"vocabulary: must start with {', '.join(self.SPECIALS)}, got {itos[:4]}")
        if not all(isinstance(w, str) for w in itos):
            raise ConfigError("vocabulary: every entry of 'itos' must be a string")
        if len(set(itos)) != len(itos):
            dup = next(w for w, n in Counter(itos).items() if n > 1)
            raise ConfigError(f"vocabulary: word {dup!r} appears twice")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(itos)}
        self.min_freq = min_freq
        self.tokenizer = (
            tokenizer if isinstance(tokenizer, Tokenizer) else build_tokenizer(tokenizer, "vocabulary.tokenizer")
        )

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        min_freq: int = 5,
        max_size: int | None = None,
        tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
    ) -> Vocabulary:
        """Vocabulary of the tokens seen at least ``min_freq`` times (at most ``max_size`` besides the
        specials); ``token_lists`` are the training captions as ``tokenizer`` splits them. A trained
        tokenizer (bpe, unigram) brings its whole token list instead, in its own order."""
        cls._check_cut(min_freq, max_size)
        if not isinstance(tokenizer, Tokenizer):
            tokenizer = build_tokenizer(tokenizer, "vocabulary.tokenizer")
        trained = tokenizer.tokens() is not None  # its own list: no counting
        counts = Counter() if trained else Counter(w for tokens in token_lists for w in tokens)
        return cls.from_counts(counts, min_freq, max_size, tokenizer)

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int],
        min_freq: int = 5,
        max_size: int | None = None,
        tokenizer: str | Tokenizer = DEFAULT_TOKENIZER,
    ) -> Vocabulary:
        """:meth:`build` from each token's count in the training captions (``token -> count``, e.g.
        data/records.py's ``CaptionTable.counts``): the same vocabulary as from the captions."""
        cls._check_cut(min_freq, max_size)
        if not isinstance(tokenizer, Tokenizer):
            tokenizer = build_tokenizer(tokenizer, "vocabulary.tokenizer")
        fixed = tokenizer.tokens()  # a trained tokenizer's own list: every token it can emit, in its order
        if fixed is not None:
            words = [w for w in fixed if w not in cls.SPECIALS]
            return cls(list(cls.SPECIALS) + words, min_freq=1, tokenizer=tokenizer)
        words = sorted(
            (w for w, n in counts.items() if n >= min_freq and w not in cls.SPECIALS), key=lambda w: (-counts[w], w)
        )
        return cls(list(cls.SPECIALS) + words[:max_size], min_freq=min_freq, tokenizer=tokenizer)

    @staticmethod
    def _check_cut(min_freq: int, max_size: int | None) -> None:
        if min_freq < 1:
            raise ConfigError(f"min_freq must be at least 1, got {min_freq}")
        if max_size is not None and max_size < 0:
            raise ConfigError(f"max_size must be non-negative, got {max_size}")

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Vocabulary)
            and self.itos == other.itos
            and self.tokenizer.name == other.tokenizer.name
            and self.tokenizer.version == other.tokenizer.version
        )

    def __repr__(self) -> str:
        version = "" if self.tokenizer.version is None else f", tokenizer_version={self.tokenizer.version}"
        return f"Vocabulary({len(self)} tokens, min_freq={self.min_freq}, tokenizer={self.tokenizer.name!r}{version})"

    def encode(self, tokens: Sequence[str], max_length: int | None = None) -> list[int]:
        """``[BOS] + ids of the first max_length words + [EOS]``; unknown words -> UNK."""
        words = tokens if max_length is None else tokens[:max_length]
        return [self.bos_id] + [self.stoi.get(w, self.unk_id) for w in words] + [self.eos_id]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words of ``ids`` (a list or 1-d tensor) up to the first EOS; PAD and BOS dropped, UNK kept."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        words = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            words.append(self.itos[i] if 0 <= i < len(self.itos) else self.UNK)
        return words

    def decode_text(self, ids: Iterable[int]) -> str:
        """The caption as text: :meth:`decode`'s tokens joined by the tokenizer (``words``: by
        spaces, punctuation tokens attached to the word before them, "a cross, a circle")."""
        return self.tokenizer.detokenize(self.decode(ids))

    def to_dict(self) -> dict:
        """JSON-able form, stored in checkpoints, model folders and vocabulary files:
        ``{"itos": [...], "min_freq": n}``, plus ``"tokenizer": name`` for a tokenizer other than
        ``words`` (so that a ``words`` vocabulary is stored as before, and read back the same),
        ``"tokenizer_version"``: the version of a versioned tokenizer's splitting (words, chars,
        jieba), and ``"tokenizer_model"``: a trained tokenizer's model (bpe, unigram: plain JSON values)."""
        d = {"itos": list(self.itos), "min_freq": self.min_freq}
        if self.tokenizer.name != DEFAULT_TOKENIZER:
            d["tokenizer"] = self.tokenizer.name
        if self.tokenizer.version is not None:
            d["tokenizer_version"] = self.tokenizer.version
        state = self.tokenizer.state()
        if state is not None:
            d["tokenizer_model"] = state
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Vocabulary:
        if not isinstance(d, dict) or not isinstance(d.get("itos"), list):
            raise ConfigError("vocabulary: expected a dictionary with a list 'itos'")
        name = d.get("tokenizer", UNRECORDED_TOKENIZER)  # a vocabulary that names none: captioning/compat.py
        if not isinstance(name, str):
            raise ConfigError(f"vocabulary: 'tokenizer' must be a tokenizer's name, got {name!r}")
        state = d.get("tokenizer_model")
        version = d.get("tokenizer_version", UNRECORDED_TOKENIZER_VERSION)  # none recorded: captioning/compat.py
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError(f"vocabulary: 'tokenizer_version' must be an integer, got {version!r}")
        if state is None and name in TOKENIZERS and TOKENIZERS.get(name).trainable:
            raise ConfigError(
                f"vocabulary: the {name!r} tokenizer is trained, but its model ('tokenizer_model') is missing"
            )
        tokenizer = build_tokenizer(name, "vocabulary.tokenizer", state=state, version=version)
        min_freq = d.get("min_freq")
        if min_freq is not None and (isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1):
            raise ConfigError(f"vocabulary: 'min_freq' must be a positive integer or null, got {str(min_freq)[:40]}")
        return cls(d["itos"], min_freq=min_freq, tokenizer=tokenizer)

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Vocabulary:
        path = os.fspath(path)
        d = read_json_file(path, ConfigError, "a vocabulary file")  # any bytes: one line naming the file
        try:
            return cls.from_dict(d)
        except ConfigError as err:
            raise ConfigError(f"{path}: {str(err).removeprefix('vocabulary: ')}") from None
