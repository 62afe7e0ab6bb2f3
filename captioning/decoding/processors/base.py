"""The logits processor's contract (:class:`Processor`), their registry (:data:`PROCESSORS`) and the
chain a search applies (:class:`LogitsProcessor`).

A processor declares its decoding options (``option(...)``: GenerationConfig's fields, flags, form
fields and API keywords come from them), whether it reads the tokens generated so far, its torch
``__call__`` (fixed shapes, no host reads: the step may be captured as a CUDA graph) and, for the
ONNX captioner, a numpy twin or the reason it refuses. No torch at import: the ONNX captioner
imports this without it; a processor imports torch where it uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, dataclass
from typing import Any, ClassVar

import numpy as np

from captioning.registry import Registry
from captioning.vocab import Vocabulary

EOS, PAD = Vocabulary.eos_id, Vocabulary.pad_id


@dataclass(frozen=True)
class Context:
    """What processors are built for: the vocabulary's size, the ids of its bad endings (None: the
    decoder does not know its words) and the device of the tables (None: numpy arrays, for the
    ONNX captioner's twins)."""

    vocab_size: int
    bad_ending_ids: tuple[int, ...] | None = None
    device: Any = None

    @classmethod
    def of(cls, decoder, device) -> Context:
        """The context of a decoder (its ``vocab_size`` and ``bad_ending_ids``) on ``device``."""
        return cls(decoder.vocab_size, getattr(decoder, "bad_ending_ids", None), device)

    def mask(self, ids) -> Any:
        """(V,) bool, true at ``ids``: a tensor on the device, or a numpy array."""
        table = np.zeros(self.vocab_size, dtype=bool)
        table[list(ids)] = True
        if self.device is None:
            return table
        import torch

        return torch.from_numpy(table).to(self.device)

    def ids(self, ids) -> Any:
        """(P,) int64 of ``ids``: a tensor on the device, or a numpy array."""
        array = np.asarray(list(ids), dtype=np.int64)
        if self.device is None:
            return array
        import torch

        return torch.from_numpy(array).to(self.device)


class Processor:
    """One processing of the decoder's log-probabilities (N, V), built once per search.

    Class attributes:
        options: its decoding options, ``{name: option(default, help, min=..., ...)}``: fields of
            GenerationConfig once the class is registered (decoding/options.py: ``option``).
        needs_tokens: whether it reads the tokens generated so far (``prefix``: the loops carry
            them, (N, max_new_tokens), through the steps).
        last: applied after every processor that is not (the forced prefix: it decides the rows it forces).
        onnx_refusal: without :meth:`numpy`, why the ONNX captioner refuses a non-default value.
        example: GenerationConfig keywords that set each of its options off its default (with what
            they need beside them): the setting tests/export/test_onnx_parity.py decodes with.

    ``__init__(config, context)`` reads the config (resolved: token ids, not words) and builds its
    tables (:class:`Context`: ``mask``, ``ids``), on the device or, for the ONNX captioner, as
    numpy arrays. ``__call__(logp, previous, lengths, prefix)``: logp (N, V), the previous tokens
    (N,), the tokens generated per row (N,), the tokens so far (N, T) or None -> logp (N, V), in
    torch, fixed shapes, no host reads. :meth:`numpy` is the same in numpy (the ONNX captioner's).
    """

    options: ClassVar[dict[str, Field]] = {}
    needs_tokens: ClassVar[bool] = False
    last: ClassVar[bool] = False
    onnx_refusal: ClassVar[str] = "does not implement it"
    example: ClassVar[dict[str, Any]] = {}

    def __init__(self, config, context: Context):
        self.config, self.context = config, context

    @classmethod
    def active(cls, config) -> bool:
        """Whether ``config`` asks for this processor: one of its options is not at its default."""
        return any(getattr(config, name) != f.default for name, f in cls.options.items())

    @classmethod
    def relation_problem(cls, config, say: Callable[..., str]) -> str | None:
        """Why its options do not go with the config's other fields, in one line (None: they do).
        ``say(name[, value])`` words a field as the user gave it (generation.py: ``relation_problem``)."""
        return None

    @classmethod
    def resolve(cls, config, vocab: Vocabulary) -> dict[str, Any]:
        """The changes to ``config`` that write its words as ``vocab``'s ids (one-line ConfigError for
        a word it lacks); GenerationConfig.resolve_tokens gathers them."""
        return {}

    @classmethod
    def onnx_decision(cls) -> str | None:
        """None when the numpy twin honours it, else why the ONNX captioner refuses it."""
        return None if cls.numpy is not Processor.numpy else cls.onnx_refusal

    def __call__(self, logp, previous, lengths, prefix):
        raise NotImplementedError

    def numpy(self, logp: np.ndarray, previous: np.ndarray, lengths: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class ProcessorRegistry(Registry[type[Processor]]):
    """The registered processors, in the order they apply (:meth:`classes`). A registration (or
    :meth:`unregister`) tells the watchers (:meth:`watch`): GenerationConfig takes the options as
    fields, the ONNX captioner its decision, the web form and the API's docstring their lines."""

    def __init__(self, kind: str, field: str | None = None):
        super().__init__(kind, field)
        self._watchers: list[Callable[[], None]] = []

    def register(self, name: str, *aliases: str) -> Callable[[type[Processor]], type[Processor]]:
        add = super().register(name, *aliases)

        def register_processor(cls: type[Processor]) -> type[Processor]:
            if not (isinstance(cls, type) and issubclass(cls, Processor)):
                raise TypeError(f"logits processor {name!r}: a Processor subclass, not {cls!r}")
            add(cls)
            try:
                self._changed()
            except BaseException:
                for key in (name, *aliases):
                    self._entries.pop(key, None)
                self._changed()
                raise
            return cls

        return register_processor

    def unregister(self, name: str) -> None:
        """Remove a processor (and so its options) registered under ``name`` (tests, notebooks)."""
        cls = self._entries.pop(name)
        for key in [k for k, v in self._entries.items() if v is cls]:
            del self._entries[key]
        self._changed()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after each registration and removal."""
        self._watchers.append(callback)

    def _changed(self) -> None:
        for callback in self._watchers:
            callback()

    def classes(self) -> list[type[Processor]]:
        """The registered processors, in the order they apply: registration order, ``last`` ones after."""
        unique = list(dict.fromkeys(self._entries.values()))
        return [c for c in unique if not c.last] + [c for c in unique if c.last]


#: the logits processors: built-in ones in decoding/processors/, a plugin's from its own file
PROCESSORS = ProcessorRegistry("logits processor")


class LogitsProcessor:
    """The processors ``config`` asks for (:meth:`Processor.active`), built once per search, in
    the order they apply. ``needs_prefix``: whether one reads the tokens generated so far."""

    def __init__(self, config, context: Context):
        self.processors = [cls(config, context) for cls in PROCESSORS.classes() if cls.active(config)]
        self.needs_prefix = any(p.needs_tokens for p in self.processors)

    def __call__(self, logp, previous, lengths, prefix):
        """logp (N, V), previous tokens (N,), tokens generated per row (N,), prefix (N, T) or None."""
        for processor in self.processors:
            logp = processor(logp, previous, lengths, prefix)
        return logp

    def numpy(self, logp: np.ndarray, previous: np.ndarray, lengths: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """The same in numpy: each processor's twin (the ONNX captioner's)."""
        for processor in self.processors:
            logp = processor.numpy(logp, previous, lengths, prefix)
        return logp


def extend_prefix(prefix, lengths, tokens):
    """prefix (N, T) with ``tokens`` (N,) written at column ``lengths`` (N,) (the tokens generated
    before them; PAD for finished rows, written past their end)."""
    return prefix.scatter(1, lengths.clamp(max=prefix.size(1) - 1).unsqueeze(1), tokens.unsqueeze(1))
