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

Built in: ``words`` (the default: lower-cased words and numbers, the project's own pattern, versioned
by :data:`WORDS_VERSION` in the vocabulary), ``chars``, ``jieba``, and the subwords ``bpe`` / ``unigram``
(their trained model kept in the vocabulary, :meth:`Tokenizer.state`): docs/LANGUAGES.md, "Tokenizers".
Text in CJK scripts is joined without spaces (:func:`join_words`); :func:`pick_tokenizer` chooses
``jieba`` (else ``chars``) for training captions that are mostly CJK.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence

from captioning import word_chars
from captioning.errors import ConfigError
from captioning.registry import Registry

TOKENIZERS: Registry[type[Tokenizer]] = Registry("tokenizer", field="data.tokenizer")
DEFAULT_TOKENIZER = "words"  # what vocabularies that name none were built with

#: the version of the word pattern (``words``, and the spaced-script words of ``chars`` and ``jieba``)
#: that new vocabularies record; docs/LANGUAGES.md shows what each version does
WORDS_VERSION = 2
WORDS_VERSIONS = (1, 2)


def _char_class(ranges: str) -> str:
    """A regular-expression class body of word_chars' "0041-005A 00AA ..." ranges."""
    parts = []
    for item in ranges.split():
        a, _, b = item.partition("-")
        parts.append(re.escape(chr(int(a, 16))) + (f"-{re.escape(chr(int(b, 16)))}" if b else ""))
    return "".join(parts)


@functools.cache
def word_pattern(version: int = WORDS_VERSION) -> re.Pattern:
    """The compiled pattern of a word, by version; inner apostrophes and hyphens join the parts
    ("man's", "t-shirt") and punctuation-only tokens are dropped, as in the Karpathy splits' own
    "tokens" (captioning/word_chars.py holds the characters).

    1. nltk 3.10.4's ``RegexpTokenizer(r"\\w+(?:['\\-]\\w+)*")`` (the ``regex`` engine's ``\\w``: letters, marks,
       decimal digits, letter numbers, connector punctuation, the join controls), reproduced without nltk.
    2. letters, marks (so that Devanagari, Thai or Arabic words stay whole), every number (digits,
       fractions, superscripts: "½", "x²") and connector punctuation; a zero-width (non-)joiner stays
       inside a word, never starts one."""
    if version == 1:
        w = f"[{_char_class(word_chars.V1)}]"
        return re.compile(f"{w}+(?:['\\-]{w}+)*")
    if version == 2:
        w, j = _char_class(word_chars.V2), word_chars.JOIN_CONTROLS
        word = f"[{w}][{w}{j}]*"
        return re.compile(f"{word}(?:['\\-]{word})*")
    raise ConfigError(
        f"vocabulary.tokenizer_version: {version!r} is not a version of the word pattern this release knows "
        f"({', '.join(map(str, WORDS_VERSIONS))}); a newer release of captioning wrote it"
    )


_PUNCTUATION_GAP = re.compile(r" ([,.;:!?])(?= |$)")  # a space before a punctuation token

# Scripts written without spaces between words: CJK ideographs (and their extensions and
# compatibility forms), Hiragana, Katakana (full and half width), and CJK punctuation.
_CJK_RANGES = (
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF01, 0xFF0F),  # full-width punctuation
    (0xFF1A, 0xFF20),
    (0xFF5B, 0xFF65),
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x20000, 0x3134F),  # CJK extensions B-G
)
_CJK_CHAR = "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES)
_CJK_SPLIT = re.compile(f"([{_CJK_CHAR}])")  # a word -> its CJK characters and the runs between them


def is_cjk(char: str) -> bool:
    """Whether ``char`` belongs to a script written without spaces between words (Han, kana)."""
    code = ord(char)
    return any(a <= code <= b for a, b in _CJK_RANGES)


_ALNUM_RUN = re.compile(r"[^\W_]+")  # letters and digits (str.isalnum), a run at a time
_CJK_RUN = re.compile(f"[{_CJK_CHAR}]+")


def cjk_share(texts: Iterable[str]) -> float:
    """The share of CJK characters among the letters and digits of ``texts`` (0 with none).
    Counted a run of characters at a time by regular expressions (a dataset's captions are read
    once, at COCO's size 600,000 of them); ASCII text holds no CJK character."""
    cjk = total = 0
    for text in texts:
        total += sum(map(len, _ALNUM_RUN.findall(text)))
        if not text.isascii():
            cjk += sum(sum(map(str.isalnum, run)) for run in _CJK_RUN.findall(text))
    return cjk / total if total else 0.0


def join_words(tokens: Sequence[str]) -> str:
    """Tokens as text: a space between two tokens only where both sides are spaced-script
    characters (``["a", "dog"]`` -> "a dog", ``["左", "上", "角"]`` -> "左上角", ``["3", "个"]`` ->
    "3个"); a punctuation token attaches to the token before it."""
    out: list[str] = []
    for token in tokens:
        if not token:
            continue
        if out and not (is_cjk(out[-1][-1]) or is_cjk(token[0]) or _is_punctuation(token)):
            out.append(" ")
        out.append(token)
    return "".join(out)


def _is_punctuation(token: str) -> bool:
    return all(unicodedata.category(c).startswith("P") for c in token)


def _normalise(text: str) -> str:
    """NFC ("e" + accent -> "é"), lower case, the typographic apostrophe as "'"."""
    return unicodedata.normalize("NFC", text).lower().replace("\u2019", "'")


class Tokenizer:
    """Text <-> tokens. Subclasses set ``name`` (their registered name) and implement both ways.

    A tokenizer learned from the training captions (``trainable``) implements :meth:`train`,
    :meth:`state` / :meth:`load_state` (what the vocabulary stores of it) and :meth:`tokens` (its
    whole token list, which becomes the vocabulary's).
    """

    name: str
    trainable: bool = False  # learned from the training captions (bpe, unigram)
    #: the versions of its splitting a vocabulary may record (None: one way only), and this one's
    versions: tuple[int, ...] | None = None
    version: int | None = None

    def __init__(self, vocab_size: int | None = None, size_field: str = "data.vocab_size"):
        if vocab_size is not None:
            raise ConfigError(
                f"{size_field}: only a trained tokenizer (bpe, unigram) takes a vocabulary size, not {self.name!r} "
                "(data.max_vocab_size caps the others)"
            )

    def tokenize(self, text: str) -> list[str]:
        """The tokens of a caption (empty for a caption with nothing to learn from)."""
        raise NotImplementedError

    def detokenize(self, tokens: Sequence[str]) -> str:
        """The text of a generated caption's tokens (special tokens already removed)."""
        raise NotImplementedError

    def scoring_tokens(self, text: str) -> list[str] | None:
        """The tokens BLEU, ROUGE-L and CIDEr count for a caption in this tokenizer's language, or None
        where the PTB tokenizer (English) applies (metrics/coco.py)."""
        return None

    @property
    def trained(self) -> bool:
        return not self.trainable

    def train(self, texts: Iterable[str]) -> None:
        raise NotImplementedError

    def tokens(self) -> list[str] | None:
        """Every token a trained tokenizer can emit (the vocabulary's list), None for the others."""
        return None

    def state(self) -> dict | None:
        """What a trained tokenizer needs to be rebuilt (plain JSON values), None for the others."""
        return None

    def load_state(self, state: dict) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def tokenize(text: str, version: int = WORDS_VERSION) -> list[str]:
    """Lower-cased words of ``text``: ``"A Dog's ball, 2 cafés!"`` -> ``["a", "dog's", "ball", "2", "cafés"]``
    (the ``words`` tokenizer; ``version``: the word pattern's, :func:`word_pattern`)."""
    return word_pattern(version).findall(_normalise(text))


class WordPatternTokenizer(Tokenizer):
    """A tokenizer that splits words with :func:`word_pattern`, at the version its vocabulary
    records (new ones: :data:`WORDS_VERSION`)."""

    versions = WORDS_VERSIONS

    def __init__(
        self, vocab_size: int | None = None, size_field: str = "data.vocab_size", version: int = WORDS_VERSION
    ):
        super().__init__(vocab_size, size_field)
        self.version = version
        self._word = word_pattern(version)  # (an unknown version: one line)

    def words(self, text: str) -> list[str]:
        """The words of ``text`` (NFC, lower case, "’" as "'")."""
        return self._word.findall(_normalise(text))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, version={self.version})"


@TOKENIZERS.register("words")
class WordTokenizer(WordPatternTokenizer):
    """Lower-cased words and numbers (:func:`tokenize`); text is the words joined by spaces, with
    punctuation tokens (which a vocabulary given by hand may hold) attached to the word before them
    ("a cross, a circle")."""

    name = "words"

    def tokenize(self, text: str) -> list[str]:
        return self.words(text)

    def detokenize(self, tokens: Sequence[str]) -> str:
        return _PUNCTUATION_GAP.sub(r"\1", " ".join(tokens))


def _split_cjk(word: str) -> list[str]:
    """A word -> its CJK characters one by one, the runs of other characters between them whole."""
    return [piece for piece in _CJK_SPLIT.split(word) if piece and not piece.isspace()]


@TOKENIZERS.register("chars")
class CharTokenizer(WordPatternTokenizer):
    """One token per CJK character ("左上角" -> 左, 上, 角); words of spaced scripts, digit runs and
    Latin runs inside CJK text kept whole ("3个T恤" -> 3, 个, t, 恤); punctuation dropped as ``words``
    drops it. Text: :func:`join_words`."""

    name = "chars"

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in self.words(text) for piece in _split_cjk(word)]

    def detokenize(self, tokens: Sequence[str]) -> str:
        return join_words(tokens)

    def scoring_tokens(self, text: str) -> list[str]:
        return self.tokenize(text)


def _jieba():
    """The jieba module, quiet (its dictionary loads on first use), its dictionary cache in this
    user's own folder (:func:`jieba_cache_folder`); one line if not installed."""
    try:
        import jieba
    except ImportError:
        raise ConfigError(
            "data.tokenizer: 'jieba' needs the jieba package: pip install -e '.[zh]' (or use data.tokenizer: chars)"
        ) from None
    import logging

    jieba.setLogLevel(logging.WARNING)
    if jieba.dt.tmp_dir is None:  # (a folder the caller chose is kept)
        jieba.dt.tmp_dir = jieba_cache_folder()
    return jieba


def _private_folder(path: str) -> bool:
    """Whether ``path`` is a real folder (not a link) of this user that no one else may write in."""
    import os
    import stat

    try:
        info = os.lstat(path)
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    return stat.S_ISDIR(info.st_mode) and mine and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def jieba_cache_folder() -> str:
    """Where jieba keeps the cache of its dictionary (``jieba.cache``, a marshal file it loads
    without checks: a file planted there changes every segmentation, and AI Challenger's scores).
    It is ``$XDG_CACHE_HOME/captioning/jieba`` (default ``~/.cache/captioning/jieba``), made with
    mode 0700 and used only while it and its parent are this user's folders that no one else may
    write in. Else it is a private temporary folder for this process (jieba then builds its
    dictionary again, about a second); never the shared ``$TMPDIR/jieba.cache`` of jieba's default."""
    import os
    import tempfile

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "captioning", "jieba")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        pass
    if _private_folder(folder) and _private_folder(os.path.dirname(folder)):  # (no one can swap it either)
        return folder
    return tempfile.mkdtemp(prefix="captioning-jieba-")


@TOKENIZERS.register("jieba")
class JiebaTokenizer(WordPatternTokenizer):
    """Chinese words as the ``jieba`` package segments them ("左上角有一个红色的星形" -> 左上角, 有,
    一个, 红色, 的, 星形), its default dictionary and HMM, as AI Challenger's evaluation segments;
    spaced-script words whole, punctuation dropped. Text: :func:`join_words` (jieba is needed to
    split text, not to print a model's tokens: an inference machine needs no jieba)."""

    name = "jieba"

    def tokenize(self, text: str) -> list[str]:
        jieba, tokens = _jieba(), []
        for word in self.words(text):
            if any(is_cjk(c) for c in word):
                tokens.extend(t for t in jieba.lcut(word) if t.strip())
            else:
                tokens.append(word)
        return tokens

    def detokenize(self, tokens: Sequence[str]) -> str:
        return join_words(tokens)

    def scoring_tokens(self, text: str) -> list[str]:
        return self.tokenize(text)


SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")  # the vocabulary's ids 0-3 (vocab.py), kept first in a trained one
SUBWORD_MARK = "\u2581"  # "▁": the word-start mark of the subword tokenizers (SentencePiece's)
_META = SUBWORD_MARK

#: what :meth:`SubwordTokenizer.train` builds around the model, as the library stores it (the
#: "tokenizer_model" of a vocabulary): a stored model must say the same of every part it states (a
#: part it leaves out is this), so that a file cannot bring padding, truncation, a regular expression
#: or a normaliser of its own; the model is rebuilt from its vocabulary and merges (or pieces) alone.
SUBWORD_PIPELINE = {
    "truncation": None,
    "padding": None,
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
    "pre_tokenizer": {"type": "Metaspace", "replacement": _META, "prepend_scheme": "always", "split": True},
    "post_processor": None,
    "decoder": {"type": "Metaspace", "replacement": _META, "prepend_scheme": "always", "split": True},
    "added_tokens": [
        {
            "id": i,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, token in enumerate(SPECIALS)
    ],
}
#: the most tokens a stored subword model may hold
MAX_SUBWORDS = 1_000_000


def native(call, what: str):
    """``call()``, into Hugging Face ``tokenizers`` (Rust): anything it raises, a Rust panic
    included (pyo3's PanicException, a BaseException that ``except Exception`` misses), is one line
    of ConfigError naming ``what``; Ctrl-C and exits pass."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit, GeneratorExit, ConfigError):
        raise
    except BaseException as err:  # noqa: BLE001 - the library's errors and panics
        detail = " ".join(str(err).split())[:160] or type(err).__name__
        raise ConfigError(f"{what}: the tokenizers library failed ({type(err).__name__}: {detail})") from None


def _states_the_same(stored, expected) -> bool:
    """Whether a stored part of the pipeline says what ``expected`` says (an object may leave keys
    out: the library fills them in as ``expected`` has them)."""
    if isinstance(expected, dict):
        return isinstance(stored, dict) and all(
            k in expected and _states_the_same(v, expected[k]) for k, v in stored.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(expected)
            and all(_states_the_same(a, b) for a, b in zip(stored, expected))
        )
    return type(stored) is type(expected) and stored == expected


def check_subword_model(model, kind: str, options: dict) -> dict:
    """A stored subword model (the library's JSON, :meth:`SubwordTokenizer.state`'s ``model``), checked
    in plain Python before the library reads anything of it: its pipeline is :data:`SUBWORD_PIPELINE`,
    its model of ``options``' type and options, and its vocabulary (ids 0..n-1, the specials first;
    BPE's merges of its tokens; unigram's pieces with finite scores) of at most :data:`MAX_SUBWORDS`
    tokens. Returns {"vocab", "merges"} (BPE) or {"vocab"} (unigram) to rebuild it from; one line of
    ConfigError naming the field otherwise."""
    import math

    def bad(field: str, what: str) -> ConfigError:
        return ConfigError(
            f"vocabulary.tokenizer_model: not a {kind!r} model as training writes it (model{field}: {what})"
        )

    if not isinstance(model, dict):
        raise bad("", f"expected a dictionary, got {json_shown(model)}")
    for key, value in model.items():
        if key == "model" or (key == "version" and isinstance(value, str)):
            continue
        if key not in SUBWORD_PIPELINE:
            raise bad(f".{key}", "not a part of what training writes")
        if not _states_the_same(value, SUBWORD_PIPELINE[key]):
            raise bad(
                f".{key}",
                f"{json_shown(value)}, not {json_shown(SUBWORD_PIPELINE[key])}; a pipeline made elsewhere is not read",
            )
    inner = model.get("model")
    if not isinstance(inner, dict) or inner.get("type") != options["type"]:
        raise bad(".model", f"expected a {options['type']} model, got {json_shown(inner)}")
    for key, value in inner.items():
        if key not in ("vocab", "merges") and (key not in options or not _states_the_same(value, options[key])):
            raise bad(f".model.{key}", f"{json_shown(value)}, not what training writes")
    vocab = inner.get("vocab")
    if options["type"] == "BPE":
        if not isinstance(vocab, dict) or not all(isinstance(k, str) and type(v) is int for k, v in vocab.items()):
            raise bad(".model.vocab", "expected an object of tokens and their ids")
        if not 4 <= len(vocab) <= MAX_SUBWORDS or sorted(vocab.values()) != list(range(len(vocab))):
            raise bad(".model.vocab", f"expected ids 0..n-1, each once (n from 4 to {MAX_SUBWORDS:,})")
        if any(vocab.get(token) != i for i, token in enumerate(SPECIALS)):
            raise bad(".model.vocab", f"expected {', '.join(SPECIALS)} as ids 0-3")
        merges = inner.get("merges")
        if not isinstance(merges, list) or len(merges) > len(vocab):
            raise bad(".model.merges", "expected a list of at most one merge per token")
        pairs = []
        for k, merge in enumerate(merges):
            pair = merge.split(" ") if isinstance(merge, str) else merge
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(p, str) and p in vocab for p in pair)
                and pair[0] + pair[1] in vocab
            ):
                raise bad(f".model.merges[{k}]", f"expected two tokens whose join is a token, got {json_shown(merge)}")
            pairs.append((pair[0], pair[1]))
        return {"vocab": dict(vocab), "merges": pairs}
    if not isinstance(vocab, list) or not 4 <= len(vocab) <= MAX_SUBWORDS:
        raise bad(".model.vocab", f"expected a list of 4 to {MAX_SUBWORDS:,} [piece, score]")
    pieces = []
    for k, item in enumerate(vocab):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and item[0]
            and isinstance(item[1], (int, float))
            and not isinstance(item[1], bool)
            and math.isfinite(item[1])
        ):
            raise bad(f".model.vocab[{k}]", f"expected [a piece, a finite score], got {json_shown(item)}")
        pieces.append((item[0], float(item[1])))
    if [p for p, _ in pieces[:4]] != list(SPECIALS) or len({p for p, _ in pieces}) != len(pieces):
        raise bad(".model.vocab", f"expected {', '.join(SPECIALS)} first and every piece once")
    return {"vocab": pieces}


def json_shown(value, limit: int = 80) -> str:
    """A JSON value in a one-line message, cut to ``limit`` characters."""
    import json

    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SubwordTokenizer(Tokenizer):
    """A subword vocabulary trained on the training captions by Hugging Face ``tokenizers``: NFC and
    lower case, words marked by "▁" at their start (SentencePiece's Metaspace), so that text comes
    back by joining the pieces and turning each "▁" into a space; CJK text, without spaces, is one
    "word" split into pieces. The specials are the vocabulary's own (``<unk>`` for an unseen character).

    A stored model (:meth:`load_state`) is checked in plain Python (:func:`check_subword_model`) and
    rebuilt from its vocabulary and merges (or pieces) around the pipeline :meth:`train` builds: the
    library never parses a stored pipeline, and every call into it is :func:`native`."""

    trainable = True
    #: the model's type and options as training writes them (tokenizers' JSON of the model)
    model_options: dict = {}

    def __init__(self, vocab_size: int | None = None, size_field: str = "data.vocab_size"):
        if vocab_size is None:
            raise ConfigError(
                f"{size_field}: the {self.name!r} tokenizer learns a vocabulary of a given size; "
                f"set {size_field} (e.g. 1000 for small data, 8000 for COCO)"
            )
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 8:
            raise ConfigError(f"{size_field}: expected an integer >= 8, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self._model = None  # the trained tokenizers.Tokenizer (rebuilt from _parts on first use)
        self._state: dict | None = None  # its stored form: a model read back needs no library to print text
        self._parts: dict | None = None  # a stored model's checked vocabulary and merges (or pieces)

    @staticmethod
    def _library():
        try:
            import tokenizers
        except ImportError:
            raise ConfigError(
                "data.tokenizer: 'bpe' and 'unigram' need Hugging Face tokenizers: pip install -e '.[subword]'"
            ) from None
        return tokenizers

    def _new_model(self, lib, parts: dict | None = None):
        """The library's model: empty (to train), or ``parts`` (:func:`check_subword_model`'s)."""
        raise NotImplementedError

    def _trainer(self, lib, specials: list[str]):
        raise NotImplementedError

    @staticmethod
    def _pipeline(lib, model):
        """The library's tokenizer of ``model`` with the pipeline of :data:`SUBWORD_PIPELINE`."""
        tokenizer = lib.Tokenizer(model)
        tokenizer.normalizer = lib.normalizers.Sequence([lib.normalizers.NFC(), lib.normalizers.Lowercase()])
        tokenizer.pre_tokenizer = lib.pre_tokenizers.Metaspace(replacement=_META, prepend_scheme="always")
        tokenizer.decoder = lib.decoders.Metaspace(replacement=_META, prepend_scheme="always")
        return tokenizer

    @property
    def trained(self) -> bool:
        return self._model is not None or self._state is not None

    def train(self, texts: Iterable[str]) -> None:
        lib = self._library()

        def fit():
            model = self._pipeline(lib, self._new_model(lib))
            model.train_from_iterator((t.replace("\u2019", "'") for t in texts), self._trainer(lib, list(SPECIALS)))
            return model

        self._model, self._state, self._parts = native(fit, f"training the {self.name!r} tokenizer"), None, None

    def _require_trained(self):
        if self._model is None and self._parts is not None:
            lib = self._library()

            def rebuild():
                model = self._pipeline(lib, self._new_model(lib, self._parts))
                model.add_special_tokens(list(SPECIALS))  # as training marks them (ids 0-3 already)
                return model

            self._model = native(rebuild, f"vocabulary.tokenizer_model: the {self.name!r} model")
        if self._model is None:
            raise ConfigError(f"tokenizer {self.name!r}: not trained (its vocabulary holds no 'tokenizer_model')")
        return self._model

    def tokenize(self, text: str) -> list[str]:
        model = self._require_trained()
        text = text.replace("\u2019", "'")
        return native(lambda: model.encode(text, add_special_tokens=False).tokens, f"tokenizer {self.name!r}")

    def detokenize(self, tokens: Sequence[str]) -> str:
        text = "".join(tokens).replace(_META, " ").strip()
        return re.sub(r" +", " ", text)

    def tokens(self) -> list[str]:
        model = self._require_trained()
        vocab = native(model.get_vocab, f"tokenizer {self.name!r}")
        return sorted(vocab, key=vocab.get)

    def state(self) -> dict:
        if self._state is None:
            import json

            model = self._require_trained()
            self._state = {
                "vocab_size": self.vocab_size,
                "model": json.loads(native(model.to_str, f"tokenizer {self.name!r}")),
            }
        return self._state

    def load_state(self, state: dict) -> None:
        """Keep a stored model, checked (:func:`check_subword_model`: nothing of it reaches the library
        unchecked); it is rebuilt when text is first split, so that printing a model's captions
        (detokenize) needs no library."""
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            raise ConfigError(f"vocabulary.tokenizer_model: expected the trained {self.name!r} model as a dictionary")
        parts = check_subword_model(state["model"], self.name, self.model_options)
        self._model, self._state, self._parts = None, state, parts
        size = state.get("vocab_size")
        self.vocab_size = size if isinstance(size, int) and not isinstance(size, bool) else self.vocab_size

    @classmethod
    def from_state(cls, state: dict) -> SubwordTokenizer:
        tok = cls(8)  # (the stored size replaces it)
        tok.load_state(state)
        return tok


@TOKENIZERS.register("bpe")
class BPETokenizer(SubwordTokenizer):
    """Byte-pair encoding (Sennrich et al. 2016): merges of the most frequent pairs, ``data.vocab_size`` tokens."""

    name = "bpe"
    model_options = {
        "type": "BPE",
        "dropout": None,
        "unk_token": "<unk>",
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
    }

    def _new_model(self, lib, parts: dict | None = None):
        if parts is None:
            return lib.models.BPE(unk_token="<unk>")
        return lib.models.BPE(vocab=parts["vocab"], merges=parts["merges"], unk_token="<unk>")

    def _trainer(self, lib, specials):
        return lib.trainers.BpeTrainer(vocab_size=self.vocab_size, special_tokens=specials, show_progress=False)


@TOKENIZERS.register("unigram")
class UnigramTokenizer(SubwordTokenizer):
    """A unigram language model over subwords (Kudo 2018, SentencePiece's default), ``data.vocab_size`` tokens."""

    name = "unigram"
    model_options = {"type": "Unigram", "unk_id": SPECIALS.index("<unk>"), "byte_fallback": False}

    def _new_model(self, lib, parts: dict | None = None):
        if parts is None:
            return lib.models.Unigram()
        return lib.models.Unigram(parts["vocab"], SPECIALS.index("<unk>"), False)

    def _trainer(self, lib, specials):
        return lib.trainers.UnigramTrainer(
            vocab_size=self.vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False
        )


def build_tokenizer(
    name: str = DEFAULT_TOKENIZER,
    field: str | None = None,
    vocab_size: int | None = None,
    state: dict | None = None,
    size_field: str = "data.vocab_size",
    version: int | None = None,
) -> Tokenizer:
    """The tokenizer registered as ``name``; a one-line :class:`ConfigError` naming ``field`` and
    every registered name otherwise. ``vocab_size``: a trained tokenizer's size (the option named
    ``size_field``); ``state``: a trained tokenizer's stored model (:meth:`Tokenizer.state`);
    ``version``: the version of its splitting a vocabulary recorded (newest: None)."""
    cls = TOKENIZERS.get(name, field)
    if state is not None and cls.trainable:
        return cls.from_state(state)
    if version is not None and cls.versions is not None:
        return cls(vocab_size, size_field, version=version)
    if vocab_size is None and not cls.trainable:
        return cls()  # a user's tokenizer may take no arguments
    return cls(vocab_size, size_field)


#: the share of CJK characters above which training captions get a CJK tokenizer by default
CJK_SHARE = 0.5


def pick_tokenizer(texts: Iterable[str]) -> str | None:
    """``jieba`` (``chars`` where jieba is not installed) for captions mostly in CJK characters,
    None otherwise (the caller keeps ``words``)."""
    if cjk_share(texts) <= CJK_SHARE:
        return None
    try:
        import jieba  # noqa: F401
    except ImportError:
        return "chars"
    return "jieba"


def list_tokenizers() -> list[str]:
    """The registered tokenizers' names."""
    return TOKENIZERS.names()
