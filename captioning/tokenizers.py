"""Tokenizers: caption text -> tokens (what the vocabulary counts and the model writes) and back.

A tokenizer is one class registered in :data:`TOKENIZERS`::

    @TOKENIZERS.register("chars")
    class CharTokenizer(Tokenizer):
        name = "chars"

        def tokenize(self, text): return [c for c in text if not c.isspace()]

        def detokenize(self, tokens): return "".join(tokens)

The data names one (``data.tokenizer``); the vocabulary built from its tokens records its name
(:class:`~captioning.vocab.Vocabulary`), so that every route that turns ids back into text (the
API, evaluation, the web page, the ONNX captioner) joins tokens the way they were split.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from nltk.tokenize import RegexpTokenizer

from captioning.registry import Registry

TOKENIZERS: Registry[type[Tokenizer]] = Registry("tokenizer", field="data.tokenizer")
DEFAULT_TOKENIZER = "words"  # what vocabularies that name none were built with

# Words and numbers (any script), keeping inner apostrophes and hyphens ("man's", "t-shirt");
# punctuation-only tokens are dropped, as in the Karpathy splits' own "tokens".
_WORD = RegexpTokenizer(r"\w+(?:['\-]\w+)*")
_PUNCTUATION_GAP = re.compile(r" ([,.;:!?])(?= |$)")  # a space before a punctuation token


class Tokenizer:
    """Text <-> tokens. Subclasses set ``name`` (their registered name) and implement both ways."""

    name: str

    def tokenize(self, text: str) -> list[str]:
        """The tokens of a caption (empty for a caption with nothing to learn from)."""
        raise NotImplementedError

    def detokenize(self, tokens: Sequence[str]) -> str:
        """The text of a generated caption's tokens (special tokens already removed)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def tokenize(text: str) -> list[str]:
    """Lower-cased words of ``text``: ``"A Dog's ball, 2 cafés!"`` -> ``["a", "dog's", "ball", "2", "cafés"]``
    (the ``words`` tokenizer)."""
    text = unicodedata.normalize("NFC", text).lower().replace("\u2019", "'")  # NFC: "e" + accent -> "é"
    return _WORD.tokenize(text)


@TOKENIZERS.register("words")
class WordTokenizer(Tokenizer):
    """Lower-cased words and numbers (:func:`tokenize`); text is the words joined by spaces, with
    punctuation tokens (which a vocabulary given by hand may hold) attached to the word before them
    ("a cross, a circle")."""

    name = "words"

    def tokenize(self, text: str) -> list[str]:
        return tokenize(text)

    def detokenize(self, tokens: Sequence[str]) -> str:
        return _PUNCTUATION_GAP.sub(r"\1", " ".join(tokens))


def build_tokenizer(name: str = DEFAULT_TOKENIZER, field: str | None = None) -> Tokenizer:
    """The tokenizer registered as ``name``; a one-line :class:`ConfigError` naming ``field`` and
    every registered name otherwise."""
    return TOKENIZERS.get(name, field)()


def list_tokenizers() -> list[str]:
    """The registered tokenizers' names."""
    return TOKENIZERS.names()
