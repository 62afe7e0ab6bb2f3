"""Definitions every layer shares: the path type, the default device and the attention grid's shape."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a device is made: the ONNX route runs without it
    import torch

PathLike = str | os.PathLike[str]


def grid_shape(num_locations: int) -> tuple[int, int]:
    """(gh, gw) of L locations: a square grid when L is a square (every encoder here), else one row.

    Encoders flatten their grid row-major: location l is cell (l // gw, l % gw)."""
    side = math.isqrt(num_locations)
    return (side, side) if side * side == num_locations else (1, num_locations)


def default_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` if given (checked: a one-line ConfigError if it is not one, or is not here), else
    CUDA when a GPU is visible, else the CPU."""
    import torch

    from captioning.errors import ConfigError

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device}: not a device (expected cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"--device {device}: no CUDA GPU is available here; use --device cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"--device {device}: there are {count} CUDA GPU(s) (cuda:0 to cuda:{count - 1})")
    elif device.type not in ("cpu", "mps"):
        raise ConfigError(f"--device {device}: expected cpu or cuda")
    return device
