"""The tokens coco-caption's scores count, by the language of the references.

pycocoevalcap's PTB tokenizer (metrics/ptb.py) is English's: it keeps a run of Chinese characters,
which has no spaces, as one token, so BLEU, ROUGE-L and CIDEr of Chinese captions would compare
whole sentences. References mostly in CJK characters are scored on Chinese words instead, as AI
Challenger's evaluation does (jieba; one token per character where jieba is not installed):
:func:`scoring_tokenizer` decides once per scoring from the references, so that models of any
tokenizer (words, chars, jieba, bpe) are scored on the same tokens. METEOR, whose stems, synonyms
and paraphrases are English's, is then reported unavailable (:func:`meteor_reason`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

from captioning.tokenizers import Tokenizer, build_tokenizer, pick_tokenizer

PTB = "ptb"  # the name the scores' notes give the English (PTB) tokens


def scoring_tokenizer(references: Iterable[str]) -> Tokenizer | None:
    """The tokenizer whose tokens the scores count for these reference captions: None for the PTB
    tokens (spaced scripts), else ``jieba`` (``chars`` without jieba) for mostly-CJK captions."""
    name = pick_tokenizer(references)
    return build_tokenizer(name) if name is not None else None


def tokenize_corpus(tokenizer: Tokenizer, captions_for_image: Mapping[Hashable, Sequence[str]]) -> dict:
    """{key: [caption, ...]} -> {key: [its tokens joined by single spaces, ...]} (what the scorers take)."""
    return {key: [" ".join(tokenizer.tokenize(c)) for c in captions] for key, captions in captions_for_image.items()}


def meteor_reason(tokenizer: Tokenizer) -> str:
    """Why METEOR is not computed on ``tokenizer``'s tokens."""
    return (
        f"METEOR not computed: its stems, synonyms and paraphrases are English's, and these captions are "
        f"scored on {tokenizer.name!r} tokens (metrics/languages.py)"
    )
