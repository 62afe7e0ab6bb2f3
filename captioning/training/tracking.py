"""Pictures to whichever Lightning logger a run uses (TensorBoard, CSV, Weights & Biases, MLflow).

Scalars (the training curves, the validation scores) reach every logger through Lightning's
``self.log``; pictures have no common call, so :func:`log_picture` speaks each logger's own:

* TensorBoard: ``SummaryWriter.add_image`` (the images tab);
* Weights & Biases (offline too): ``WandbLogger.log_image``, with the caption;
* MLflow (a local file store too): ``MlflowClient.log_image`` as the run's artifact ``KEY/step_NNNNNN.png``;
* CSV, and any logger without a picture call: a PNG file ``KEY/step_NNNNNN.png`` under its log folder.
"""

from __future__ import annotations

import logging
import os

import numpy as np
from PIL import Image

log = logging.getLogger(__name__)


def picture_file(key: str, step: int) -> str:
    """The relative path a picture is stored under where the logger keeps files: ``KEY/step_NNNNNN.png``."""
    return os.path.join(*key.split("/"), f"step_{step:06d}.png")


def log_picture(logger, key: str, picture: np.ndarray, step: int, caption: str | None = None) -> str:
    """Log ``picture`` (H, W, 3) uint8 under ``key`` at ``step`` to ``logger``; returns where it went
    ("tensorboard", "wandb", "mlflow" or the PNG file's path)."""
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

    picture = np.ascontiguousarray(picture, dtype=np.uint8)
    if isinstance(logger, TensorBoardLogger) or hasattr(getattr(logger, "experiment", None), "add_image"):
        logger.experiment.add_image(key, picture, step, dataformats="HWC")
        return "tensorboard"
    if isinstance(logger, WandbLogger):
        logger.log_image(key=key, images=[picture], step=step, caption=[caption] if caption else None)
        return "wandb"
    if isinstance(logger, MLFlowLogger):
        logger.experiment.log_image(logger.run_id, picture, artifact_file=picture_file(key, step).replace(os.sep, "/"))
        return "mlflow"
    folder = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
    if folder is None:
        return ""
    path = os.path.join(folder, picture_file(key, step))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(picture).save(path)
    return path
