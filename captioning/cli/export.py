"""``captioning export``: a checkpoint as a model folder to share (safetensors) or as ONNX graphs.

    captioning export --checkpoint best.ckpt --out model/                  # model.safetensors, config.json, vocab.json, README.md
    captioning export --checkpoint best.ckpt --out model_onnx/ --format onnx   # encoder.onnx, decoder_step*.onnx, ...

The checkpoint is read by the loader of every command (storage/load.py: a checkpoint file, a model
folder or a Hub id); the model card gets its training data, steps and best validation score, and
the test scores of an ``evaluate`` report given with ``--metrics``. storage/folder.py writes the
safetensors folder, export/onnx.py the graphs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from captioning.storage.folder import metrics_card, read_metrics, save_folder
from captioning.storage.load import load_model


def export(checkpoint: str, out: str, format: str = "safetensors", metrics: Optional[str] = None,
           opset: Optional[int] = None) -> Path:
    """Write the model folder of ``checkpoint`` in ``format`` ("safetensors" or "onnx"). Returns the folder."""
    report = read_metrics(metrics)  # a bad report stops the export before the model is read
    model = load_model(checkpoint)
    card = dict(model.card, **metrics_card(report)) if report else model.card
    if format == "onnx":
        from captioning.export.onnx import OPSET, export_onnx

        return export_onnx(model, out, card, opset=opset or OPSET)
    if format != "safetensors":
        raise ValueError(f"format must be 'safetensors' or 'onnx', got {format!r}")
    return save_folder(out, model, card)
