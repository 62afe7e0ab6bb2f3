"""How captions are generated: :class:`GenerationConfig`, with the names of Hugging Face's
``generate``, its fields described as user-facing options (:func:`generation_options`).

Its fields are the search's own (beams, length, sampling, attention) and the options of every
registered logits processor (decoding/processors/: repetition_penalty, no_repeat_ngram_size,
min_new_tokens, suppress_tokens, forbid_bad_endings, prefix; a plugin's, once its file is
imported). Kept free of torch, so that the ONNX captioner (onnx_captioner.py), which runs without
PyTorch, takes the same settings with the same checks.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from captioning.decoding.options import OPTION_TYPES, GenerationOption, option
from captioning.decoding.processors import (  # noqa: F401 (BAD_ENDINGS, bad_ending_ids, prefix_ids: re-exported)
    BAD_ENDINGS,
    PROCESSORS,
    bad_ending_ids,
    prefix_ids,
)
from captioning.errors import ConfigError
from captioning.models import ATTENTION_MODES
from captioning.vocab import Vocabulary


@dataclass
class GenerationConfig:
    """How captions are generated, with the names of Hugging Face's ``generate``.

    Each field's one-line help, bounds and choices are its metadata (:func:`generation_options`
    lists them; the commands' flags and the web form are built from them). The fields after
    ``top_p`` are the options of the registered logits processors (decoding/processors/, one file
    each; their docstrings say what they do), added by :func:`_take_processor_options`. What the
    search's own fields mean in more detail:

    - attention_mode: "expected" is the expected context, as the authors' caption script; "argmax"
      the likeliest location; "sample" a sampled location. Soft-attention models always use the
      expected context.
    - attention_temperature: with the expected context, a hard-attention model takes it under
      softmax(log alpha / attention_temperature): 1 is the expected context, below 1 sharpens it
      towards the likeliest location's (towards "argmax" as it nears 0). A hard model's decoder,
      trained on sampled locations for part of its captions, can score better with a sharper
      context (docs/studies/HARD_ATTENTION.md); choose it on the validation split. Soft-attention
      models, and the modes "argmax" and "sample", ignore it.
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
    - top_p: nucleus sampling: draw among the smallest set of likeliest words whose probability
      reaches top_p (at least one word).

    The processors act on the decoder's log-probabilities in the registry's order (Hugging Face's
    for the built-in ones: repetition penalty, n-gram blocking, min_new_tokens, suppressed tokens,
    bad endings; the forced prefix last); sampling then applies temperature, top_k, top_p.
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
    top_p: float = option(
        1.0,
        "with do_sample: sample among the likeliest words of total probability P (nucleus sampling; 1: every word)",
        min=0,
        max=1,
        min_inclusive=False,
        metavar="P",
    )

    def __post_init__(self):
        for opt in _options().values():  # each field alone: its type and bounds (GenerationOption.check)
            setattr(self, opt.name, opt.check(getattr(self, opt.name)))
        problem = relation_problem(self)
        if problem:
            raise ConfigError(problem)

    def resolve_tokens(self, vocab: Vocabulary) -> GenerationConfig:
        """This config with its words as ids of ``vocab`` (``suppress_tokens``; ``prefix``, split by
        the model's tokenizer; a processor's own: ``Processor.resolve``). A word it lacks, or an id
        beyond it, is a one-line ConfigError."""
        changes = {}
        for processor in PROCESSORS.classes():
            changes.update(processor.resolve(self, vocab))
        return dataclasses.replace(self, **changes) if changes else self

    def one_beam(self) -> GenerationConfig:
        """This config with one beam, one returned sequence and no beam groups (a captioner's default)."""
        return dataclasses.replace(self, num_beams=1, num_return_sequences=1, num_beam_groups=1, diversity_penalty=0.0)

    def replace(self, **changes) -> GenerationConfig:
        """A copy with the given fields changed; fields given as None keep their value."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


# ---------------------------------------------------------------------- the processors' options as fields
#: GenerationConfig's own fields (its class body's), before the processors' options
_OWN_FIELDS = dict(GenerationConfig.__dataclass_fields__)
#: a processor option's annotation, by its type
_ANNOTATIONS = {int: int, float: float, bool: bool, str: str, tuple: tuple[int | str, ...]}
_watchers: list[Callable[[], None]] = []


def _processor_fields() -> dict[str, dataclasses.Field]:
    """The options of every registered processor, in the order they apply; a ValueError names a
    processor whose option is not declared with ``option(...)`` or is another's name."""
    fields: dict[str, dataclasses.Field] = {}
    owners: dict[str, str] = {}
    for processor in PROCESSORS.classes():
        where = f"logits processor {processor.__name__}: its option"
        for name, f in processor.options.items():
            if not isinstance(f, dataclasses.Field) or "help" not in f.metadata:
                raise TypeError(f"{where} {name!r}: declare it with option(default, help, ...)")
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"{where} {name!r}: an option's name is a Python identifier without a leading _")
            if name in _OWN_FIELDS or name in owners:
                taken = "a field of GenerationConfig" if name in _OWN_FIELDS else f"an option of {owners[name]}"
                raise ValueError(f"{where} {name!r} is already {taken}")
            if hasattr(GenerationConfig, name) and name not in GenerationConfig.__dataclass_fields__:
                raise ValueError(f"{where} {name!r} is a method of GenerationConfig")
            fields[name], owners[name] = f, processor.__name__
    return fields


def _take_processor_options() -> None:
    """Make GenerationConfig's fields its own and every registered processor's options, then tell
    the watchers (:func:`when_options_change`). The class is processed by ``dataclasses`` again,
    in place: every module holding it sees the fields, and ``dataclasses.fields``, ``replace``,
    ``asdict``, ``==``, jsonargparse and config files treat a plugin's option as a built-in one.
    A config made before reads a new option's default (the class attribute)."""
    cls, wanted = GenerationConfig, _processor_fields()
    annotations = cls.__dict__["__annotations__"]
    for name in [n for n in annotations if n not in _OWN_FIELDS]:  # the options of before
        del annotations[name]
        if name in cls.__dict__:
            delattr(cls, name)
    for name, f in {**_OWN_FIELDS, **wanted}.items():  # each a Field again, for dataclasses to read
        setattr(cls, name, dataclasses.field(default=f.default, metadata=f.metadata))
        if name in wanted:
            annotations[name] = _ANNOTATIONS[f.metadata["type"]]
    for method in ("__init__", "__repr__", "__eq__", "__hash__", "__match_args__", "__replace__"):
        if method in cls.__dict__:  # written by dataclasses for the fields of before
            delattr(cls, method)
    dataclasses.dataclass(cls)
    _options.cache_clear()
    for callback in _watchers:
        callback()


def recorded(config: GenerationConfig) -> dict:
    """The settings a model file records: every field, except a plugin's option at its default (a
    model saved while a plugin is loaded then loads without it, unless it decodes with the option)."""
    data = dataclasses.asdict(config)
    for processor in PROCESSORS.classes():
        if processor.__module__.split(".")[0] != "captioning":
            for name, f in processor.options.items():
                if data.get(name) == f.default:
                    del data[name]
    return data


def when_options_change(callback: Callable[[], None]) -> None:
    """Call ``callback()`` whenever GenerationConfig's options change (a processor registered or
    removed): what is derived from them and kept (the web form's fields, the API's docstring)."""
    _watchers.append(callback)


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
    for processor in PROCESSORS.classes():  # its options with the others (min_new_tokens below max_new_tokens, ...)
        problem = processor.relation_problem(c, say)
        if problem:
            return problem
    return None


# ---------------------------------------------------------------------- the options' list
@functools.cache
def _options() -> dict[str, GenerationOption]:
    """GenerationConfig's fields as options, by name (built on first use, and again when they change)."""
    hints = typing.get_type_hints(GenerationConfig)
    options = {}
    for f in dataclasses.fields(GenerationConfig):
        if "help" not in f.metadata:
            raise TypeError(f"GenerationConfig.{f.name}: declare it with option(...) (its help and bounds)")
        hint = hints[f.name]
        kind = tuple if typing.get_origin(hint) is tuple else hint
        if kind not in OPTION_TYPES:
            raise TypeError(f"GenerationConfig.{f.name}: an option is an int, float, bool, str or tuple, not {hint}")
        metadata = {k: v for k, v in f.metadata.items() if k != "type"}  # (the annotation's)
        options[f.name] = GenerationOption(name=f.name, type=kind, default=f.default, **metadata)
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


_take_processor_options()  # the built-in processors' options
PROCESSORS.watch(_take_processor_options)  # and a plugin's, when it registers
