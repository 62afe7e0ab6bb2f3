"""Export: ONNX graphs of the encoder and the decoder step, and the ONNX captioner (numpy and
onnxruntime only)."""
