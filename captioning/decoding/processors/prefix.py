"""``prefix``: every search continues these words (Hugging Face's forced start)."""

from __future__ import annotations

from captioning.decoding.options import option
from captioning.decoding.processors.base import PROCESSORS, Processor
from captioning.errors import ConfigError
from captioning.tokenizers import SUBWORD_MARK
from captioning.vocab import Vocabulary

#: what cannot start a caption: EOS, PAD and BOS are not words
NOT_WORDS = (Vocabulary.eos_id, Vocabulary.pad_id, Vocabulary.bos_id, Vocabulary.EOS, Vocabulary.PAD, Vocabulary.BOS)


def _not_words_problem(tokens: tuple) -> str | None:
    for t in tokens:
        if t in NOT_WORDS:
            return f"{t!r} cannot start a caption (EOS, PAD and BOS are not words)"
    return None


def prefix_ids(text: str, vocab: Vocabulary) -> list[int]:
    """The ids of a prefix's ``text`` (one of GenerationConfig.prefix's items), split as the model's
    captions were. A token of ``vocab`` typed as it is stands for itself (a ``words``, ``chars`` or
    ``jieba`` token, a special such as ``<unk>``, a subword piece with its "▁"). Other text is split
    by the vocabulary's tokenizer: "A large" -> a, large; "左上角有" -> 左上角, 有 with ``jieba``, 左, 上,
    角, 有 with ``chars``; "a large" -> ▁a, ▁large or ▁a, ▁lar, ge with ``bpe``. A token the
    vocabulary lacks (a subword tokenizer's ``<unk>`` for an unseen character) is one line."""
    tokenizer = vocab.tokenizer
    special = text in Vocabulary.SPECIALS
    if text in vocab.stoi and (special or not tokenizer.trainable or text.startswith(SUBWORD_MARK)):
        return [vocab.stoi[text]]
    try:
        tokens = tokenizer.tokenize(text)
    except ConfigError as err:  # e.g. jieba or tokenizers not installed: the reason, one line
        raise ConfigError(f"prefix: {text!r} cannot be split: {err}") from None
    if not tokens:
        raise ConfigError(f"prefix: {text!r} holds no token of the model's {tokenizer.name!r} tokenizer")
    unknown = [t for t in tokens if t not in vocab.stoi or (t == Vocabulary.UNK and tokenizer.trainable)]
    if not unknown:
        return [vocab.stoi[t] for t in tokens]
    if tokenizer.trainable:  # a subword tokenizer spells any text from characters it saw in training
        known = set("".join(t for t in vocab.itos if t not in Vocabulary.SPECIALS))
        missing = "".join(dict.fromkeys(c for c in text.lower() if not c.isspace() and c not in known))
        raise ConfigError(
            f"prefix: {text!r} holds characters the model's {tokenizer.name!r} vocabulary lacks ({missing or '?'})"
        )
    if len(tokens) == 1:
        raise ConfigError(f"prefix: {text!r} is not a word of the model's vocabulary")
    raise ConfigError(
        f"prefix: {text!r} splits into {' '.join(tokens)} by the model's {tokenizer.name!r} tokenizer; "
        f"{unknown[0]!r} is not in its vocabulary"
    )


def force_start(logp, lengths, forced):
    """log p (N, V) where the rows with fewer than P = len(forced) tokens have one candidate, the
    prefix's next word ``forced[lengths]``, at log p 0 (so the scores add the continuation only);
    the other rows unchanged. Fixed shapes, no host reads (the step can be captured)."""
    P = forced.numel()
    word = forced[lengths.clamp(max=P - 1)]  # (N,)
    only = logp.new_full(logp.shape, float("-inf")).scatter_(1, word.unsqueeze(1), 0.0)
    return only.where((lengths < P).unsqueeze(1), logp)


@PROCESSORS.register("prefix")
class ForcedPrefix(Processor):
    """At the first steps each row's only candidate is the prefix's next word, at log-probability
    0, so a caption's score is its continuation's (its length, for length_penalty, counts the
    prefix). Text becomes ids with ``GenerationConfig.resolve_tokens``, split by the model's own
    tokenizer (:func:`prefix_ids`: "左上角有" is 左上角, 有 for a jieba model); on the command line,
    words apart. Applied last: it decides the rows it forces."""

    options = {
        "prefix": option(
            (),
            "decoding continues this text, e.g. 'a large' (split by the model's tokenizer; every search; "
            "the score is the continuation's)",
            metavar="WORDS",
            validate=_not_words_problem,
        )
    }
    last = True
    onnx_refusal = "does not force a caption's start"

    @classmethod
    def relation_problem(cls, config, say):
        if len(config.prefix) >= config.max_new_tokens:
            return (
                f"{say('prefix')} ({len(config.prefix)} words) must be shorter than {say('max_new_tokens')} "
                f"({config.max_new_tokens}): the caption needs room to continue and end"
            )
        return None

    @classmethod
    def resolve(cls, config, vocab):
        ids = []
        for t in config.prefix:  # ids as they are; text split by the model's own tokenizer
            ids.extend([t] if isinstance(t, int) else prefix_ids(t, vocab))
        if any(t >= len(vocab) for t in ids):
            raise ConfigError(f"prefix: id {max(ids)} is beyond the vocabulary ({len(vocab)} tokens)")
        return {"prefix": tuple(ids)} if tuple(ids) != config.prefix else {}

    def __init__(self, config, context):
        super().__init__(config, context)
        words = [t for t in config.prefix if not isinstance(t, int)]
        if words:
            raise ConfigError(
                f"prefix: words ({words[0]!r}) need the model's vocabulary: pass config.resolve_tokens(vocab)"
            )
        if max(config.prefix) >= context.vocab_size:
            raise ConfigError(f"prefix: id {max(config.prefix)} is beyond the vocabulary ({context.vocab_size} tokens)")
        self.forced = context.ids(config.prefix)  # (P,) the ids every caption starts with

    def __call__(self, logp, previous, lengths, prefix):
        return force_start(logp, lengths, self.forced)
