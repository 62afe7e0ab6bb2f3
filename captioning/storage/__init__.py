"""Model files: checkpoints written by ``fit``, safetensors model folders, Hub ids; one model
description read from any of them."""
