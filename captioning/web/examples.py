"""The example images offered on the page, and the run config they are found through.

Examples are image files only: the files and folders ``--examples`` names (see
``captioning.web.server``), or the first test-split images of the data a model was trained on,
found through the ``config.yaml`` LightningCLI wrote beside the run's checkpoints.
"""

from __future__ import annotations

import os
from pathlib import Path

EXAMPLES = 8  # example images offered on the page at most
CONFIG_BYTES = 1 << 20  # a run's config.yaml larger than this is not read (it names a few paths)
ANNOTATION_MB = 64  # annotation files larger than this in all are not read for examples


def training_config(checkpoint: Path) -> dict | None:
    """The data fields (``annotations``, ``images_root``, ``split_file``) of the ``config.yaml``
    LightningCLI wrote for the checkpoint's run, as ``{"data": {...}}``, or None.

    Only the layout Lightning writes is looked at: a checkpoint in a ``checkpoints`` folder, the
    config beside that folder (``<run>/checkpoints/x.ckpt`` -> ``<run>/config.yaml``, where ``<run>``
    is ``lightning_logs/version_N`` or the run's root without a logger). No other folder above the
    checkpoint is searched, files over :data:`CONFIG_BYTES` are not read, and nothing but those
    three fields is kept.
    """
    import yaml

    checkpoint = Path(checkpoint)
    if checkpoint.parent.name != "checkpoints" or not checkpoint.is_file():
        return None
    path = checkpoint.parent.parent / "config.yaml"
    try:
        if not path.is_file() or path.stat().st_size > CONFIG_BYTES:
            return None
        with open(path) as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict):
        return None
    fields = {}
    annotations = data.get("annotations")
    if isinstance(annotations, str) or (
        isinstance(annotations, list) and annotations and all(isinstance(a, str) for a in annotations)
    ):
        fields["annotations"] = annotations
    for name in ("images_root", "split_file"):
        if isinstance(data.get(name), str):
            fields[name] = data[name]
    return {"data": fields}


def is_image_file(path: Path) -> bool:
    """Whether ``path`` is a file of an image suffix that :func:`~captioning.data.images.load_image` reads."""
    from captioning.data.images import IMAGE_SUFFIXES, load_image
    from captioning.errors import ImageError

    if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
        return False
    try:
        load_image(path)
    except ImageError:
        return False
    return True


def within(path: Path, root: Path) -> bool:
    """Whether ``path``, links resolved, lies under the folder ``root``."""
    try:
        path.resolve().relative_to(root.resolve())
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def first_test_images(config: dict | None, limit: int = EXAMPLES, max_mb: float = ANNOTATION_MB) -> list[Path]:
    """The first test-split images of the data a model was trained on (``config``: :func:`training_config`).

    Annotation files over ``max_mb`` in all are not read: reading COCO's would cost seconds and
    memory at every start, for a convenience.
    """
    data = (config or {}).get("data") or {}
    annotations = data.get("annotations")
    if not annotations:
        return []
    try:
        from captioning.data.formats import load_records

        files = annotations if isinstance(annotations, list) else [annotations]
        if sum(os.path.getsize(f) for f in files) > max_mb * 1024 * 1024:
            return []
        first = files[0]
        root = Path(data.get("images_root") or Path(first).resolve().parent)
        records = [r for r in load_records(annotations, data.get("split_file")) if r.split == "test"]
        paths = [root / r.path for r in records[:limit]]
        return [p for p in paths if within(p, root) and is_image_file(p)]
    except Exception:  # noqa: BLE001 - examples are a convenience: a moved dataset just has none
        return []


def expand_examples(items) -> list[Path]:
    """The image files named, and the image files of the folders named (sorted), in the order given.

    Every example is a file of an image suffix that ``load_image`` reads; a folder's entries must
    lie inside it (a link out of it is skipped), and a named file that is not such an image is a
    ConfigError. Only these files are ever served as examples.
    """
    from captioning.errors import ConfigError

    paths: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            paths += [p for p in sorted(item.iterdir()) if within(p, item) and is_image_file(p)]
        elif not item.is_file():
            raise ConfigError(f"--examples: no such image file: {item}")
        elif not is_image_file(item):
            raise ConfigError(f"--examples: not an image file (JPEG, PNG, WebP, BMP, GIF or TIFF): {item}")
        else:
            paths.append(item)
    return paths
