"""Definitions every layer shares: the path type and the default device."""
from __future__ import annotations

import os
from typing import Optional, Union

import torch

PathLike = Union[str, "os.PathLike[str]"]


def default_device(device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """``device`` if given, else CUDA when a GPU is visible, else the CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
