"""The training step captured as a CUDA graph per input shape (``model.cuda_graphs``): forward,
losses, backward and gradient clipping recorded once and replayed (captioning/cuda_graphs.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from captioning.cuda_graphs import ShapeGraphs


class GraphedTrainingStep:
    """Forward, losses, backward and gradient clipping of a training batch, captured per shape.

    ``model``: a ShowAttendTell (or anything ``objective`` accepts as its model), run by the
    objective on the decoder's static-shape pass (``static=True``); ``params``: the trainable
    parameters, whose ``.grad`` holds the step's gradients after a call (the optimiser steps after
    it). The warm-up calls of a new shape change nothing that stays: buffers (running statistics)
    and the CUDA random state are put back before the first replay.

        step = GraphedTrainingStep(model, objective, params, clip=5.0)
        loss, logs, state, finite = step(features, captions, lengths)   # tensors on the device
        optimizer.step()
    """

    def __init__(
        self,
        model,
        objective,
        params: list,
        clip: float | None = None,
        capture: bool = True,
        encode: Callable | None = None,
    ):
        self.model, self.objective, self.params, self.clip = model, objective, list(params), clip
        self.encode = encode  # inputs (features or images) -> annotation vectors; default: the inputs
        self.buffers = [b for m in (model, objective) for b in m.buffers()]
        self.graphs = ShapeGraphs(self._body, enabled=capture, before_capture=self._save, after_capture=self._restore)

    def _body(self, inputs: Tensor, captions: Tensor, lengths: Tensor, *image_index: Tensor):
        for p in self.params:
            p.grad = None  # fresh gradients (allocated inside the graph when captured)
        batch = {"captions": captions, "lengths": lengths, **({"image_index": image_index[0]} if image_index else {})}
        features = self.encode(inputs, batch) if self.encode else inputs
        out = self.objective(self.model, features, batch, static=True)
        out.loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], self.clip, foreach=True)
        detach = lambda d: {k: v.detach() for k, v in d.items()}  # noqa: E731
        return out.loss.detach(), detach(out.logs), detach(out.state), torch.isfinite(out.loss)

    def _save(self):
        return [b.clone() for b in self.buffers], torch.cuda.get_rng_state()

    def _restore(self, saved):
        buffers, rng = saved
        with torch.no_grad():
            for b, v in zip(self.buffers, buffers):
                b.copy_(v)
        torch.cuda.set_rng_state(rng)
        return [p.grad for p in self.params]  # the gradient tensors this graph writes

    @property
    def captured(self) -> bool:
        """Whether the latest call replayed a graph."""
        return self.graphs.last is not None

    def __call__(self, inputs: Tensor, captions: Tensor, lengths: Tensor, *image_index: Tensor):
        """(loss, logs, objective state, finite): the graph's tensors when captured (a later call
        overwrites them); the parameters' ``.grad`` are this call's gradients."""
        out = self.graphs(inputs, captions, lengths, *image_index)
        if self.graphs.last is not None:  # point the parameters at this shape's graph's gradients
            for p, g in zip(self.params, self.graphs.last.extra):
                p.grad = g
        return out
