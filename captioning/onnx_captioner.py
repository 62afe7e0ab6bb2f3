"""The import path of earlier versions: ``from captioning.onnx_captioner import OnnxCaptioner``
(the captioner lives in captioning/export/onnx_captioner.py)."""

from captioning.export.onnx_captioner import OnnxCaptioner  # noqa: F401
