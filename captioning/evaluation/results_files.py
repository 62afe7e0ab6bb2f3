"""COCO results files: reading one (:func:`read_results`), writing a split's captions as one
(:func:`results_items`), and matching a file's captions to the images of a split (:func:`cover_split`),
the images named as the dataset names them (AI Challenger: by file name; data/aichallenger.py)."""

from __future__ import annotations

from captioning.errors import AnnotationError


def dataset_ids(data) -> dict[int, str]:
    """image_id -> the dataset's own id of that image, for a CaptionData whose format names its images
    otherwise (AI Challenger: the file name); {} where the image_ids are the dataset's (COCO, Flickr)."""
    return dict(data.read_annotations().dataset_ids or {})


def results_items(predictions: dict[int, str], names: dict[int, str] | None = None) -> list[dict]:
    """A COCO results list [{"image_id", "caption"}] of {image_id: caption}, each image named by the
    dataset's own id where ``names`` (:func:`dataset_ids`) has one."""
    names = names or {}
    return [{"image_id": names.get(i, i), "caption": c} for i, c in predictions.items()]


def read_results(path: str) -> dict[int | str, str]:
    """A COCO results file [{"image_id": int or str, "caption": str}, ...] -> {image_id: caption}, the ids
    as the file names them (integers, or a dataset's own names such as AI Challenger's file names; see
    :func:`cover_split`). One line of :class:`AnnotationError` for anything else (not a list, an id that is
    neither, a duplicate id, a caption that is not a string), so that nothing is scored from half a file."""
    from captioning.files import read_json_file

    items = read_json_file(path, AnnotationError, "a COCO results file", missing="no such results file")
    if not isinstance(items, list):
        raise AnnotationError(f'{path}: expected a COCO results list [{{"image_id": int, "caption": str}}, ...]')
    captions: dict[int | str, str] = {}
    for k, item in enumerate(items):
        if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
            raise AnnotationError(f'{path}: item {k}: expected an object with "image_id" and "caption"')
        i, caption = item["image_id"], item["caption"]
        if isinstance(i, bool) or not isinstance(i, (int, str)) or (isinstance(i, str) and not i.strip()):
            raise AnnotationError(
                f"{path}: item {k}: image_id must be an integer (or the dataset's own name of the image), "
                f"got {repr(i)[:40]}"
            )
        if isinstance(i, int) and not -(2**63) <= i < 2**63:
            raise AnnotationError(f"{path}: item {k}: image_id {str(i)[:40]}... is outside the 64-bit integers")
        if not isinstance(caption, str):
            raise AnnotationError(
                f"{path}: item {k} (image {i}): the caption must be a string, got {repr(caption)[:40]}"
            )
        if i in captions:
            raise AnnotationError(
                f"{path}: image_id {i!r} has more than one caption (items of a results file are one per image)"
            )
        captions[i] = caption
    if not captions:
        raise AnnotationError(f"{path}: no captions")
    return captions


def _shown(ids: list, n: int = 5) -> str:
    return ", ".join(map(str, ids[:n])) + (", ..." if len(ids) > n else "")


def _ordered(ids) -> list:
    return sorted(ids, key=lambda i: (isinstance(i, str), i))


def cover_split(
    predictions: dict, references: dict, source: str, split: str, names: dict[int, str] | None = None
) -> tuple[dict[int, str], list[str]]:
    """(the captions of images the split has, by image_id; one line per problem). ``predictions`` name
    the images as a results file does: by image_id, or where ``names`` (:func:`dataset_ids`) gives the
    dataset's own ids, by those (AI Challenger's "<hex>.jpg", also without its extension, as AI
    Challenger's evaluation names them). Captions for images the split does not have are set aside, and
    images without a caption named; an :class:`AnnotationError` when no caption is for an image of the
    split (ids of another dataset), or when one image is named twice."""
    names = names or {}
    by_name: dict = {}
    for i in references:
        name = names.get(i, i)
        by_name[name] = i
        if isinstance(name, str) and "." in name:
            by_name.setdefault(name.rsplit(".", 1)[0], i)
    kept: dict[int, str] = {}
    extra = []
    for key, caption in predictions.items():
        i = by_name.get(key)
        if i is None:
            extra.append(key)
        elif i in kept:
            raise AnnotationError(f"{source}: image {names.get(i, i)!r} has more than one caption (as {key!r} too)")
        else:
            kept[i] = caption
    missing = [names.get(i, i) for i in references if i not in kept]
    if not kept:
        raise AnnotationError(
            f"{source}: none of its {len(predictions)} image ids is an image of the {split!r} split "
            f"(ids of another dataset or split?): {_shown(_ordered(extra))}"
        )
    lines = []
    if extra:
        lines.append(
            f"{source}: {len(extra)} caption(s) for images the {split!r} split does not have, not scored: "
            f"{_shown(_ordered(extra))}"
        )
    if missing:
        lines.append(
            f"{source}: {len(missing)} image(s) of the {split!r} split without a caption, not scored: "
            f"{_shown(_ordered(missing))}"
        )
    return kept, lines
