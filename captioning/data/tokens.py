"""The tokenizer a dataset's captions get: picked for CJK captions, trained for subwords, applied.

:class:`~captioning.data.captions.CaptionData` calls :func:`fit_tokenizer` once it has read the
records. Where no tokenizer was named and the training captions are mostly CJK, it picks ``jieba``
(``chars`` without jieba) and says so in one line. A trained tokenizer (bpe, unigram) not yet
trained learns from the training captions. Then every caption is split again by the tokenizer
(the readers' own tokens are ``words``' at the newest version of its word pattern).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence

from captioning.data.records import ImageRecord, split_records
from captioning.tokenizers import DEFAULT_TOKENIZER, WORDS_VERSION, Tokenizer, build_tokenizer, pick_tokenizer


def train_tokenizer(tokenizer: Tokenizer, texts: Iterable[str]) -> None:
    """Train ``tokenizer`` on ``texts`` in this process (:func:`fit_tokenizer`'s default)."""
    tokenizer.train(texts)


def fit_tokenizer(
    tokenizer: Tokenizer,
    records: Sequence[ImageRecord],
    named: bool,
    source: str = "",
    trainer: Callable[[Tokenizer, Iterable[str]], None] = train_tokenizer,
) -> Tokenizer:
    """The tokenizer for ``records``' captions; their ``tokens`` are set by it (``words`` keeps the
    readers' tokens as they are). ``named``: the user chose ``tokenizer`` (no automatic pick).
    ``trainer(tokenizer, texts)`` trains a tokenizer that learns (a distributed run trains it on one
    rank and gives the others its model: data/datamodule.py)."""
    train = split_records(list(records), "train") or list(records)
    if not named and tokenizer.name == DEFAULT_TOKENIZER:
        picked = pick_tokenizer(c for r in train for c in r.captions)
        if picked is not None:
            print(
                f"{source or 'data'}: the training captions are mostly CJK; splitting them with the {picked!r} "
                "tokenizer (set data.tokenizer to choose another)",
                file=sys.stderr,
            )
            tokenizer = build_tokenizer(picked, "data.tokenizer")
    if not tokenizer.trained:
        trainer(tokenizer, (c for r in train for c in r.captions))
    if tokenizer.name != DEFAULT_TOKENIZER or tokenizer.version != WORDS_VERSION:  # the readers' are words'
        for r in records:
            r.tokens = [tokenizer.tokenize(c) for c in r.captions]
    return tokenizer
