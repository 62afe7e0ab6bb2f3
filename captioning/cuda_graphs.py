"""CUDA graphs: a function of tensors captured once per input shape and replayed.

A step of this model is a few thousand small kernels; on a GPU launching them from Python costs
more than running them. :class:`ShapeGraphs` records the kernels of ``fn(*inputs)`` once per
input shape (after a few warm-up calls on a side stream, as torch.cuda.graphs requires), with
every shape's graph in one shared memory pool, and afterwards copies new inputs into the captured
("static") input tensors and replays the recorded kernels: one launch. Random numbers (dropout,
hard attention's samples) are graph-safe: each replay draws new ones from the current generator
state (torch.manual_seed before a replay is honoured).

Elsewhere (the CPU, or CUDA graphs unavailable) ``fn`` simply runs: the same results, no capture.
The training step (training/captured_step.py) and the decoding loops (decoding/search.py) use this; the callers keep
what they need of the outputs before the next call, since a replay overwrites them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

log = logging.getLogger(__name__)


def graphs_available(device: torch.device | str) -> bool:
    """Whether tensors on ``device`` can be captured (a CUDA device)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


class _Captured:
    def __init__(self, graph, inputs: list[Tensor], outputs, extra):
        self.graph, self.inputs, self.outputs, self.extra = graph, inputs, outputs, extra


class ShapeGraphs:
    """``fn(*tensors) -> outputs`` (a tensor or a tuple/dict of tensors), captured per input signature.

    Args:
        fn: the function; it must not read values back to the host (no ``.item()``, no
            data-dependent Python branches) and must produce the same kernels on every call.
        enabled: capture when the inputs are on a CUDA device (False: always run ``fn``).
        warmup: eager calls on a side stream before a capture (cuDNN/cuBLAS workspaces, lazy state).
        before_capture / after_capture: called around the warm-up and capture of a new shape (e.g.
            to save and restore state the warm-up calls change); ``after_capture`` returns what is
            kept beside the graph (``extra``: e.g. the gradient tensors the capture allocated).
    """

    def __init__(
        self,
        fn: Callable,
        enabled: bool = True,
        warmup: int = 2,
        before_capture: Callable[[], object] | None = None,
        after_capture: Callable[[object], object] | None = None,
    ):
        self.fn, self.enabled, self.warmup = fn, enabled, warmup
        self.before_capture, self.after_capture = before_capture, after_capture
        self.graphs: dict[tuple, _Captured] = {}
        self.pool = None
        self.last: _Captured | None = None  # the entry of the latest replay (None after an eager call)

    @staticmethod
    def signature(inputs: Sequence[Tensor]) -> tuple:
        return tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)

    def captures(self, inputs: Sequence[Tensor]) -> bool:
        return self.enabled and len(inputs) > 0 and all(graphs_available(x.device) for x in inputs)

    def __call__(self, *inputs: Tensor):
        if not self.captures(inputs):
            self.last = None
            return self.fn(*inputs)
        key = self.signature(inputs)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(inputs)
        for static, x in zip(entry.inputs, inputs):
            static.copy_(x, non_blocking=True)
        entry.graph.replay()
        self.last = entry
        return entry.outputs

    def _capture(self, inputs: Sequence[Tensor]) -> _Captured:
        static = [x.clone() for x in inputs]
        saved = self.before_capture() if self.before_capture else None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()  # one pool for every shape's graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.fn(*static)
        extra = self.after_capture(saved) if self.after_capture else None
        log.info("captured a CUDA graph for inputs %s", [tuple(x.shape) for x in inputs])
        return _Captured(graph, static, outputs, extra)
