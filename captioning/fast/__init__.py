"""The fast path: a faster twin of a model, built from its parameters, used by the commands.

``model(...)`` and ``model.generate(...)`` run the plain model (models/decoder.py). ``fit``,
``evaluate``, ``caption``, ``serve`` and the API run :func:`fast_model` of it: a twin computing the
same function faster (lstm.py), where the model is of a form the twin knows; otherwise the plain
model itself, with one line saying why (a subclass of the paper's decoder, or an edited
models/decoder.py: the twin's code mirrors code that changed). :data:`MIRRORED` lists the plain
code the twin re-implements; the tests hold the twin equal to the plain model in float64 and
:data:`MIRRORED`'s fingerprints equal to the source (``python -m captioning.fast`` prints them).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import logging
import textwrap

import torch
from torch import Tensor, nn

log = logging.getLogger(__name__)

#: the plain code the twin re-implements -> the fingerprint of the source it was written for
MIRRORED = {
    "captioning.models.decoder:ShowAttendTellDecoder.__init__": "9bd4fc9e64c840f2",
    "captioning.models.decoder:ShowAttendTellDecoder.attend": "88ef778f3d9be4f6",
    "captioning.models.decoder:ShowAttendTellDecoder.recur": "fe07525987ccadbf",
    "captioning.models.decoder:ShowAttendTellDecoder.forward": "85277efd498f9327",
    "captioning.models.decoder:ShowAttendTellDecoder.step": "5ff55c4e4aa989c2",
    "captioning.models.decoder:AdditiveScore": "c6abe62804a4793f",
    "captioning.models.attention.luong:LuongDecoder.__init__": "7d2e093209d7735b",
    "captioning.models.attention.luong:LuongDecoder.recur": "4c1b127a90bb3e88",
    "captioning.models.attention.local:LocalWindow.centre": "2d1f0a40554dc128",
    "captioning.models.attention.local:LocalWindow.forward": "5714ee86c46c9253",
    "captioning.models.attention.dot:DotScore.query": "025a54e86285aa95",
}


def fingerprint(name: str) -> str:
    """A hash of the code ``module:qualname`` (its syntax tree without docstrings: comments,
    docstrings and formatting do not change it); "" when the source cannot be read."""
    module, qualname = name.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError):
        return ""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            if isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


@functools.cache
def edited() -> tuple[str, ...]:
    """The mirrored code whose source differs from what the twin was written for."""
    return tuple(name for name, known in MIRRORED.items() if (now := fingerprint(name)) and now != known)


def why_plain(decoder: nn.Module) -> str | None:
    """Why ``decoder`` runs plain, in words; None when the twin knows its form."""
    from captioning.models.attention.luong import LuongDecoder
    from captioning.models.decoder import ShowAttendTellDecoder

    if type(decoder) not in (ShowAttendTellDecoder, LuongDecoder):
        name = type(decoder).__name__
        if type(decoder).__module__.startswith("captioning."):  # a built-in option's subclass (over_attention)
            return f"the built-in {name} runs as written (no fast path for {name})"
        return f"{name} is a subclass of the paper's decoder"
    changed = edited()
    if changed:
        return f"{changed[0].replace(':', '.')} differs from the code the fast path mirrors"
    return None


def fast_decoder(decoder):
    """The twin of ``decoder`` (captioning/fast/lstm.py), or ``decoder`` itself (a kind that is fast
    as written, such as the transformer, or a form the twin does not know: one log line says so)."""
    from captioning.models.decoder import ShowAttendTellDecoder

    if not isinstance(decoder, ShowAttendTellDecoder):
        return decoder
    reason = why_plain(decoder)
    if reason:
        log.warning("fast path: %s; running the plain model (the same results, slower)", reason)
        return decoder
    from captioning.fast.lstm import FastLSTM

    return FastLSTM(decoder)


class FastModel:
    """A :class:`~captioning.models.show_attend_tell.ShowAttendTell` whose decoder is its twin:
    teacher forcing (``__call__``) and ``generate`` run the twin; everything else (the encoder,
    the vocabulary, ``features``, ``parameters``, ``eval``, ...) is the model's own."""

    def __init__(self, model: nn.Module, decoder):
        self.model, self.decoder = model, decoder

    def __getattr__(self, name: str):
        if name == "model":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, features: Tensor, captions: Tensor, lengths: Tensor, **kwargs):
        return self.decoder(features, captions, lengths, **kwargs)

    @torch.no_grad()
    def generate(self, images=None, features=None, config=None, generator=None):
        """As the model's ``generate``, with the twin's steps."""
        from captioning.decoding.generation import GenerationConfig
        from captioning.decoding.search import generate

        if features is None:
            features = self.model.encoder(images)
        return generate(self.decoder, features, config if config is not None else GenerationConfig(), generator)


def fast_model(model):
    """``model`` with its decoder's twin (:class:`FastModel`), or ``model`` itself where the decoder
    is fast as written or of a form the twin does not know; an ensemble's members each."""
    if isinstance(model, FastModel) or not hasattr(model, "decoder"):
        return model
    decoder = fast_decoder(model.decoder)
    return model if decoder is model.decoder else FastModel(model, decoder)
