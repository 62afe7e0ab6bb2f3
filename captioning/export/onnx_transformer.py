"""The transformer decoder's ONNX graphs (``captioning export --format onnx``, export/onnx.py):

    encoder.onnx        images -> memory (B, layers, 2, L, d): each layer's cross-attention keys
                        and values of the grid, once per image
    decoder_step.onnx   tokens (N,), position (N,), cache (N, layers, 2, T, d), memory -> log p (N, V),
                        position_next, cache_next (the step's self-attention keys and values
                        written at its position), alpha (N, L) and, with several heads, head_alpha

The cache is TransformerState's, of fixed length T (the search's max_new_tokens, a dynamic axis):
the captioner makes it, zeros, per search, as config.json's ``onnx.state`` says.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from captioning.export.onnx import ENCODER_INPUTS, EXPORTERS, B, K, _export, exportable_encoder
from captioning.storage.layout import ENCODER_ONNX, STEP_ONNX

TRANSFORMER_ENCODER_OUTPUTS = ["memory"]
TRANSFORMER_STEP_INPUTS = ["tokens", "position", "cache", "memory"]
TRANSFORMER_STEP_OUTPUTS = ["log_probs", "position_next", "cache_next", "alpha"]


class TransformerEncoderGraph(nn.Module):
    """A transformer's image side: each layer's cross-attention keys and values of the grid
    (decoder.memory: the refiner, the projection, the 2-D positions), once per image."""

    def __init__(self, model, image_size: int):
        super().__init__()
        self.encoder = exportable_encoder(model.encoder, image_size)
        self.decoder = model.decoder

    def forward(self, images: Tensor) -> Tensor:
        return self.decoder.memory(self.encoder(images))  # (B, layers, 2, L, d)


class TransformerStepGraph(nn.Module):
    """One transformer step (decoder.step) for N = B * K rows over B images: the cache
    (N, layers, 2, T, d) in and out, T read from its shape like K."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, tokens: Tensor, position: Tensor, cache: Tensor, memory: Tensor):
        from captioning.models.transformer import TransformerState

        state = TransformerState(position, cache, memory, beams=tokens.size(0) // memory.size(0))
        log_probs, state, g = self.decoder.step(tokens, state)
        heads = (g.head_alpha,) if g.head_alpha is not None else ()
        return (log_probs, state.position, state.cache, g.alpha, *heads)


def export_transformer(model, spec, S: int, out: Path, opset: int) -> dict:
    """encoder.onnx and decoder_step.onnx of a transformer decoder; config.json's onnx section."""
    decoder = model.decoder
    encoder = TransformerEncoderGraph(model, S).eval()
    images = torch.rand(B, 3, S, S)
    memory = encoder(images)
    _export(
        encoder,
        (images,),
        out / ENCODER_ONNX,
        ENCODER_INPUTS,
        TRANSFORMER_ENCODER_OUTPUTS,
        {"images": {0: "images"}, "memory": {0: "images"}},
        opset,
    )
    T = 5  # the example cache length, distinct from B, K and the layers
    cache = torch.randn(B * K, decoder.num_layers, 2, T, decoder.hidden_dim)
    args = (torch.full((B * K,), 1, dtype=torch.long), torch.full((B * K,), 2, dtype=torch.long), cache, memory)
    outputs = TRANSFORMER_STEP_OUTPUTS + (["head_alpha"] if decoder.heads > 1 else [])
    axes = {
        "tokens": {0: "rows"},
        "position": {0: "rows"},
        "cache": {0: "rows", 3: "steps"},
        "memory": {0: "images"},
        "cache_next": {0: "rows", 3: "steps"},
        **{name: {0: "rows"} for name in outputs if name != "cache_next"},
    }
    _export(
        TransformerStepGraph(decoder).eval(),
        args,
        out / STEP_ONNX["expected"],
        TRANSFORMER_STEP_INPUTS,
        outputs,
        axes,
        opset,
    )
    learned = decoder.position_embedding is not None
    return {
        "steps": {"expected": STEP_ONNX["expected"]},
        "attention_temperature": 1.0,
        "encoder_inputs": ENCODER_INPUTS,
        "encoder_outputs": TRANSFORMER_ENCODER_OUTPUTS,
        "step_inputs": TRANSFORMER_STEP_INPUTS,
        "step_outputs": outputs,
        "state": {
            # "steps": the search's max_new_tokens (the cache's fixed length, as TransformerState's)
            "carried": {
                "position": {"zeros": [], "dtype": "int64"},
                "cache": {"zeros": [decoder.num_layers, 2, "steps", decoder.hidden_dim], "dtype": "float32"},
            },
            "constants": ["memory"],
            # learned positions end at max_positions: a longer search needs the PyTorch model to say so too
            "max_steps": decoder.max_positions if learned else None,
        },
    }


EXPORTERS.add(
    "transformer", (export_transformer, lambda config: "")
)  # its step graph is decoder.step, every option included
