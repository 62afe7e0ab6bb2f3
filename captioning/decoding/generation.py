"""How captions are generated: :class:`GenerationConfig`, with the names of Hugging Face's
``generate``, its fields described as user-facing options (:func:`generation_options`), and the
words a caption should not end with.

Kept apart from search.py and free of torch, so that the ONNX captioner (onnx_captioner.py), which
runs without PyTorch, takes the same settings with the same checks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any

from captioning.errors import ConfigError
from captioning.models import ATTENTION_MODES
from captioning.tokenizers import SUBWORD_MARK
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


# ---------------------------------------------------------------------- options: one field, one description
# Every GenerationConfig field is declared with option(...): its default and its metadata (help,
# bounds, choices, whether it is a flag of the decoding commands and a field of the web form).
# generation_options() turns the metadata into GenerationOption objects; the config's checks, the
# command-line flags (cli/options.py), the web form and the API's docstring are all derived from
# them, so a new decoding option is its field here plus the code that acts on it.
def option(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
    choices: tuple[str, ...] | None = None,
    cli: bool = True,
    web: bool = True,
    metavar: str | None = None,
) -> Any:
    """A GenerationConfig field with its option metadata (see :class:`GenerationOption`)."""
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "min": min,
            "max": max,
            "min_inclusive": min_inclusive,
            "max_inclusive": max_inclusive,
            "choices": choices,
            "cli": cli,
            "web": web,
            "metavar": metavar,
        },
    )


def _shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters (a message stays one short line)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


@dataclass(frozen=True)
class GenerationOption:
    """One :class:`GenerationConfig` field as an option users set: on the command line, in the web
    form, as a keyword of ``Captioner.__call__``, in a config's ``generation`` section.

    Attributes:
        name: the field (``num_beams``); :attr:`flag` is its command-line flag (``--num-beams``).
        type: ``int``, ``float`` (always finite), ``bool``, ``str`` (one of ``choices``) or ``tuple``
            (token ids >= 0 or words: ``suppress_tokens``).
        default: the field's default (the commands' flags default to None: the model's own).
        help: one line, what the option does.
        min, max: the bounds of a number (None: unbounded on that side); ``min_inclusive`` /
            ``max_inclusive``: whether the bound itself is allowed.
        choices: the allowed values of a ``str`` option.
        cli: a flag of the decoding commands (caption, attend, evaluate, compare-attention).
        web: accepted by the web form and HTTP API. The server may cap what costs it time
            (num_beams, max_new_tokens, location_samples multiply the work) below ``max``.
        metavar: the flag's placeholder in ``--help`` (None: argparse's).

    :meth:`check` (a value) and :meth:`parse` (a text from a command line or a form) refuse a
    value in one line naming the field, the same line wherever the value came from;
    ``GenerationConfig.__post_init__`` runs :meth:`check` on every field, then the checks that
    relate fields (num_beam_groups divides num_beams, ...).
    """

    name: str
    type: type
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True
    choices: tuple[str, ...] | None = None
    cli: bool = True
    web: bool = True
    metavar: str | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--num-beams`` for ``num_beams``."""
        return "--" + self.name.replace("_", "-")

    def expected(self) -> str:
        """What a valid value is, in words: "an integer >= 1", "a finite number in (0, 1]"."""
        if self.type is bool:
            return "true or false"
        if self.type is str:
            return "one of " + ", ".join(self.choices or ())
        if self.type is tuple:
            return "token ids >= 0 or words"
        what = "an integer" if self.type is int else "a finite number"
        low, high = self.min, self.max
        if low is not None and high is not None:
            return (
                f"{what} in {'[' if self.min_inclusive else '('}{_number(low)}, "
                f"{_number(high)}{']' if self.max_inclusive else ')'}"
            )
        if low is not None:
            return f"{what} {'>=' if self.min_inclusive else '>'} {_number(low)}"
        if high is not None:
            return f"{what} {'<=' if self.max_inclusive else '<'} {_number(high)}"
        return what

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is refused ("expected an integer >= 1, got 0"), or None when it is valid."""
        if self.type is tuple:
            return _token_problem(value, self.name)
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is str:
            ok = isinstance(value, str) and value in (self.choices or ())
        else:
            number = isinstance(value, int) if self.type is int else isinstance(value, (int, float))
            ok = number and not isinstance(value, bool) and (self.type is int or math.isfinite(value))
            if ok and self.min is not None:
                ok = value >= self.min if self.min_inclusive else value > self.min
            if ok and self.max is not None:
                ok = value <= self.max if self.max_inclusive else value < self.max
        return None if ok else f"expected {self.expected()}, got {_shown(value)}"

    def check(self, value: Any) -> Any:
        """``value`` (a list of tokens as a tuple) if valid, else a one-line ConfigError naming the field."""
        if self.name == "prefix" and isinstance(value, str):  # a text: its words ("" none)
            value = tuple(value.split())
        problem = self.problem(value)
        if problem:
            raise ConfigError(f"{self.name}: {problem}")
        if self.type is tuple:
            return tuple(value) if isinstance(value, (list, tuple)) else (value,)
        return value

    def convert(self, text: str) -> Any:
        """``text`` (a command line's or a form's) as this option's type, unchecked; a ValueError
        says what was expected. Booleans: true/false, yes/no, on/off, 1/0; tokens: comma-separated
        ids or words ("<unk>,3")."""
        text = text.strip()
        if self.type is int:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"expected an integer, got {_shown(text)}") from None
        if self.type is float:
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"expected a number, got {_shown(text)}") from None
        if self.type is bool:
            truth = {
                "true": True,
                "yes": True,
                "on": True,
                "1": True,
                "false": False,
                "no": False,
                "off": False,
                "0": False,
            }
            if text.lower() not in truth:
                raise ValueError(f"expected true or false, got {_shown(text)}")
            return truth[text.lower()]
        if self.type is tuple:
            items = [t.strip() for t in text.split(",")]
            if not all(items):
                raise ValueError(f"expected comma-separated token ids or words, got {_shown(text)}")
            items = [word for item in items for word in item.split()]  # "a large" is two words
            return tuple(int(t) if t.lstrip("-").isdigit() else t for t in items)
        return text

    def parse(self, text: str) -> Any:
        """``text`` converted and checked: the value, or a one-line ConfigError naming the field."""
        try:
            value = self.convert(text)
        except ValueError as err:
            raise ConfigError(f"{self.name}: {err}") from None
        return self.check(value)


def _token_problem(tokens: Any, name: str = "suppress_tokens") -> str | None:
    """Why ``suppress_tokens`` (or ``prefix``: ``name``) is refused, or None."""
    if isinstance(tokens, (str, int)):
        tokens = (tokens,)
    if not isinstance(tokens, (list, tuple)):
        return f"expected a list of token ids or words, got {_shown(tokens)}"
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, str)) or (isinstance(t, int) and t < 0) or t == "":
            return f"expected token ids >= 0 or words, got {_shown(t)}"
        if name == "prefix" and t in (Vocabulary.eos_id, Vocabulary.pad_id, Vocabulary.bos_id):
            return f"{t!r} cannot start a caption (EOS, PAD and BOS are not words)"
        if name == "prefix" and t in (Vocabulary.EOS, Vocabulary.PAD, Vocabulary.BOS):
            return f"{t!r} cannot start a caption (EOS, PAD and BOS are not words)"
        if name != "prefix" and t in (Vocabulary.eos_id, Vocabulary.pad_id, Vocabulary.EOS, Vocabulary.PAD):
            return f"{t!r} cannot be suppressed (captions end with it); min_new_tokens sets a least length"
    return None


def prefix_ids(text: str, vocab: Vocabulary) -> list[int]:
    """The ids of a prefix's ``text`` (one of GenerationConfig.prefix's items), split as the model's
    captions were: a token of ``vocab`` typed as it is stands for itself (a ``words``, ``chars`` or
    ``jieba`` token, a special such as ``<unk>``, a subword piece with its "▁"); other text is split
    by the vocabulary's tokenizer ("A large" -> a, large; "左上角有" -> 左上角, 有 with ``jieba``, 左, 上,
    角, 有 with ``chars``; "a large" -> ▁a, ▁large or ▁a, ▁lar, ge with ``bpe``). A token the
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


@dataclass
class GenerationConfig:
    """How captions are generated, with the names of Hugging Face's ``generate``.

    Each field's one-line help, bounds and choices are its metadata (:func:`generation_options`
    lists them; the commands' flags and the web form are built from them). What the fields mean
    in more detail:

    - attention_mode: "expected" is the expected context, as the authors' caption script; "argmax"
      the likeliest location; "sample" a sampled location. Soft-attention models always use the
      expected context.
    - attention_temperature: with the expected context, a hard-attention model takes it under
      softmax(log alpha / attention_temperature): 1 is the expected context, below 1 sharpens it
      towards the likeliest location's (towards "argmax" as it nears 0). A hard model's decoder,
      trained on sampled locations for part of its captions, can score better with a sharper
      context (docs/studies/HARD_ATTENTION.md); choose it on the validation split. Soft-attention
      models, and the modes "argmax" and "sample", ignore it.
    - forbid_bad_endings: EOS gets probability 0 after a word of :data:`BAD_ENDINGS`, and so do the
      words of BAD_ENDINGS at the last step max_new_tokens allows: a caption that the length limit
      cuts ends on a good word too ("... to the right of" cannot happen; the search picks the best
      good word there, and beam search weighs it in the beams' scores).
    - location_samples: K > 1 decodes each image K times with sampled locations (attention_mode
      is then "sample") and keeps the caption of the best score
      (:func:`captioning.decoding.search.best_of_k`). Soft-attention models ignore it.
    - cuda_graphs: on a CUDA device each step is captured as a CUDA graph per (batch, beams) shape
      and replayed (decoding/search.py: the same captions; sampling is not captured); elsewhere the
      same fixed-shape loop runs without capture.
    - num_beam_groups: diverse beam search (Vijayakumar et al. 2016): the num_beams beams form
      this many groups of num_beams / num_beam_groups, searched in turn at each step; a group's
      candidates lose ``diversity_penalty`` times the number of times each word was chosen at this
      step by the groups before it (Hugging Face's Hamming diversity; the penalty enters the beam
      scores, as there).
    - no_repeat_ngram_size: n > 0: a word that would complete an n-gram already in the caption
      gets probability 0 (3: ruotianluo's block_trigrams).
    - repetition_penalty: Hugging Face's (CTRL, Keskar et al. 2019), applied to the
      log-probabilities (all <= 0): a word already generated has its log p multiplied by the
      penalty (> 1 discourages repeats), without renormalising, as Hugging Face's beam search
      processes log-probabilities; the scores add the processed values.
    - top_p: nucleus sampling: draw among the smallest set of likeliest words whose probability
      reaches top_p (at least one word).
    - suppress_tokens: words become ids with :meth:`resolve_tokens` (the searches take ids).
    - prefix: every search continues these words (Hugging Face's forced start): at the first
      steps each row's only candidate is the prefix's next word, at log-probability 0, so a
      caption's score is its continuation's (its length, for length_penalty, counts the prefix).
      Text becomes ids with :meth:`resolve_tokens`, split by the model's own tokenizer
      (:func:`prefix_ids`: "左上角有" is 左上角, 有 for a jieba model); on the command line, words apart.

    Every processed score (penalties, bans) is applied to the decoder's log-probabilities in the
    order of Hugging Face's processors: repetition penalty, n-gram blocking, min_new_tokens,
    suppressed tokens, bad endings; sampling then applies temperature, top_k, top_p.
    """

    num_beams: int = option(1, "beams per image (1: greedy decoding)", min=1)
    max_new_tokens: int = option(30, "the longest caption, in tokens (EOS included)", min=1)
    length_penalty: float = option(1.0, "beam scores are the summed log-probabilities divided by length ** this")
    do_sample: bool = option(
        False, "sample each word from the model's distribution instead of taking the likeliest (one beam only)"
    )
    temperature: float = option(
        1.0,
        "with do_sample: divide the log-probabilities by this before sampling (below 1 sharpens)",
        min=0,
        min_inclusive=False,
    )
    top_k: int = option(0, "with do_sample: sample among the K likeliest words only (0: all)", min=0, metavar="K")
    attention_mode: str = option(
        "expected",
        "how a hard-attention model picks its context: the expected context, the likeliest location or a sampled one",
        choices=ATTENTION_MODES,
    )
    attention_temperature: float = option(
        1.0,
        "hard attention, expected context: take it under softmax(log alpha / "
        "TAU); below 1 sharpens it towards the likeliest location's",
        min=0,
        min_inclusive=False,
        metavar="TAU",
    )
    num_return_sequences: int = option(
        1, "the best beams to return for each image (at most num_beams)", min=1, cli=False
    )  # the commands decide how many captions they print
    forbid_bad_endings: bool = option(
        False, "never end a caption on an article, preposition or conjunction ('a', 'with', 'and'...)"
    )
    location_samples: int = option(
        1,
        "hard attention: decode each image K times with sampled locations and keep the best-scoring caption",
        min=1,
        metavar="K",
    )
    cuda_graphs: bool = option(
        False, "on a CUDA device, replay each decoding step as a captured CUDA graph (the same captions)", web=False
    )  # how the server runs, not what it writes
    num_beam_groups: int = option(
        1,
        "diverse beam search: the beams form G groups (G divides num_beams), each "
        "penalised for the words the earlier groups chose at the same step (needs "
        "diversity_penalty)",
        min=1,
        metavar="G",
    )
    diversity_penalty: float = option(
        0.0, "diverse beam search: subtracted from a word's score per earlier group that chose it", min=0
    )
    no_repeat_ngram_size: int = option(
        0, "never repeat an n-gram of N words within a caption (3: block trigrams; 0: off)", min=0, metavar="N"
    )
    repetition_penalty: float = option(
        1.0,
        "multiply the log-probability of words already in the caption by this (> 1 discourages repeats)",
        min=0,
        min_inclusive=False,
    )
    top_p: float = option(
        1.0,
        "with do_sample: sample among the likeliest words of total probability P (nucleus sampling; 1: every word)",
        min=0,
        max=1,
        min_inclusive=False,
        metavar="P",
    )
    min_new_tokens: int = option(0, "captions of at least N words (EOS is forbidden before)", min=0, metavar="N")
    suppress_tokens: tuple[int | str, ...] = option(
        (), "words or token ids never generated, e.g. '<unk>' (comma-separated on the command line)", metavar="TOKENS"
    )

    prefix: tuple[int | str, ...] = option(
        (),
        "decoding continues this text, e.g. 'a large' (split by the model's tokenizer; every search; "
        "the score is the continuation's)",
        metavar="WORDS",
    )

    def __post_init__(self):
        for opt in _options().values():  # each field alone: its type and bounds (GenerationOption.check)
            setattr(self, opt.name, opt.check(getattr(self, opt.name)))
        problem = relation_problem(self)
        if problem:
            raise ConfigError(problem)

    def resolve_tokens(self, vocab: Vocabulary) -> GenerationConfig:
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
        prefix = []
        for t in self.prefix:  # ids as they are; text split by the model's own tokenizer
            prefix.extend([t] if isinstance(t, int) else prefix_ids(t, vocab))
        if any(t >= len(vocab) for t in prefix):
            raise ConfigError(f"prefix: id {max(prefix)} is beyond the vocabulary ({len(vocab)} tokens)")
        changes = {}
        if ids != self.suppress_tokens:
            changes["suppress_tokens"] = tuple(ids)
        if tuple(prefix) != self.prefix:
            changes["prefix"] = tuple(prefix)
        return dataclasses.replace(self, **changes) if changes else self

    def one_beam(self) -> GenerationConfig:
        """This config with one beam, one returned sequence and no beam groups (a captioner's default)."""
        return dataclasses.replace(self, num_beams=1, num_return_sequences=1, num_beam_groups=1, diversity_penalty=0.0)

    def replace(self, **changes) -> GenerationConfig:
        """A copy with the given fields changed; fields given as None keep their value."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


# ---------------------------------------------------------------------- how the fields relate
def field_words(name: str, value: Any = None) -> str:
    """A field, or the act of setting it, in the API's and the configs' words: ``num_beams``;
    ``set num_beams 1``, ``set do_sample false``."""
    if value is None:
        return name
    return f"set {name} {str(value).lower() if isinstance(value, bool) else value}"


def flag_words(name: str, value: Any = None) -> str:
    """A field, or the act of setting it, in the command line's words: ``--num-beams``;
    ``give --num-beams 1``, ``add --do-sample``, ``leave out --do-sample``. A field that is no flag
    (``num_return_sequences``: the commands set it) keeps its name."""
    if not _options()[name].cli:
        return field_words(name, value)
    flag = _options()[name].flag
    if value is None:
        return flag
    if isinstance(value, bool):
        return f"add {flag}" if value else f"leave out {flag}"
    return f"give {flag} {value}"


def relation_problem(config: Any, say: typing.Callable[..., str] = field_words) -> str | None:
    """Why the fields of ``config`` (a GenerationConfig, or anything with its attributes) do not go
    together, in one line, or None. ``say(name[, value])`` words a field or the act of setting it:
    :func:`field_words` (the API's and the configs' names) or :func:`flag_words` (the command line's
    flags, for the settings a user typed as flags)."""
    c = config
    if c.do_sample and c.num_beams > 1:
        return (
            f"{say('do_sample')} works with one beam: {say('num_beams', 1)} to sample, "
            f"or {say('do_sample', False)} for beam search"
        )
    if c.num_return_sequences > c.num_beams:
        return (
            f"{say('num_return_sequences')} ({c.num_return_sequences}) cannot exceed {say('num_beams')} ({c.num_beams})"
        )
    if c.num_beams % c.num_beam_groups:
        return f"{say('num_beam_groups')} ({c.num_beam_groups}) must divide {say('num_beams')} ({c.num_beams})"
    if c.num_beam_groups > 1 and c.do_sample:
        return f"{say('num_beam_groups')} (diverse beam search) does not sample: {say('do_sample', False)}"
    if c.num_beam_groups > 1 and c.diversity_penalty == 0:
        return (
            f"{say('num_beam_groups')} > 1 needs {say('diversity_penalty')} > 0 "
            "(otherwise the groups are the same beams)"
        )
    if c.diversity_penalty > 0 and c.num_beam_groups == 1:
        return (
            f"{say('diversity_penalty')} applies between beam groups: set {say('num_beam_groups')} > 1 "
            f"(dividing {say('num_beams')})"
        )
    if c.top_p < 1 and not c.do_sample:
        return f"{say('top_p')} ({c.top_p}) applies to sampling: {say('do_sample', True)} (with one beam)"
    if len(c.prefix) >= c.max_new_tokens:
        return (
            f"{say('prefix')} ({len(c.prefix)} words) must be shorter than {say('max_new_tokens')} "
            f"({c.max_new_tokens}): the caption needs room to continue and end"
        )
    if c.min_new_tokens >= c.max_new_tokens:
        return (
            f"{say('min_new_tokens')} ({c.min_new_tokens}) must be below {say('max_new_tokens')} "
            f"({c.max_new_tokens}): a caption needs room for EOS"
        )
    return None


# ---------------------------------------------------------------------- the options' list
@functools.cache
def _options() -> dict[str, GenerationOption]:
    """GenerationConfig's fields as options, by name (built once, on first use)."""
    hints = typing.get_type_hints(GenerationConfig)
    options = {}
    for f in dataclasses.fields(GenerationConfig):
        if "help" not in f.metadata:
            raise TypeError(f"GenerationConfig.{f.name}: declare it with option(...) (its help and bounds)")
        hint = hints[f.name]
        kind = tuple if typing.get_origin(hint) is tuple else hint
        if kind not in (int, float, bool, str, tuple):
            raise TypeError(f"GenerationConfig.{f.name}: an option is an int, float, bool, str or tuple, not {hint}")
        options[f.name] = GenerationOption(name=f.name, type=kind, default=f.default, **f.metadata)
    return options


def generation_options() -> list[GenerationOption]:
    """Every :class:`GenerationConfig` field as a :class:`GenerationOption` (name, type, default,
    help, bounds, choices, whether it is a command-line flag / a web-form field), in field order.

    The one description of the decoding options: the command-line flags (``cli`` true;
    cli/options.py), the web form (``web`` true: parse each submitted text with
    :meth:`GenerationOption.parse`, then build the config, which checks the fields together) and
    the API's docstring are derived from it.
    """
    return list(_options().values())


def generation_option(name: str) -> GenerationOption:
    """The option of the field ``name`` (a one-line ConfigError listing the fields if there is none)."""
    options = _options()
    if name not in options:
        raise ConfigError(f"unknown decoding option {name!r}; expected one of {', '.join(options)}")
    return options[name]
