"""The shapes data in every layout the project reads: a Karpathy JSON saved as a ``datasets`` folder in
the layouts of yerevann/coco-karpathy, nlphuji/flickr30k and jxie/flickr8k, and as WebDataset shards;
then whether two layouts give the same records (ids, splits, tokens, image bytes) in the same order,
in which case training from them is the same run.

    python -m tools.studies.data_layouts_study build --annotations DATA/dataset_shapes.json --out OUT
    python -m tools.studies.data_layouts_study compare OUT/json OUT/coco_karpathy [--images-root DATA]

``build`` writes OUT/coco_karpathy, OUT/flickr30k, OUT/flickr8k (save_to_disk folders) and
OUT/shards (``captioning prepare --to-webdataset``). ``compare`` prints the first difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}


def _rows(annotations: Path) -> list[dict]:
    return json.loads(annotations.read_text())["images"]


def _bytes(annotations: Path, img: dict) -> bytes:
    return (annotations.parent / img.get("filepath", "") / img["filename"]).read_bytes()


def coco_karpathy(annotations: Path, out: Path) -> None:
    """yerevann/coco-karpathy: no image bytes, Hub splits train/validation/test, sentences as strings."""
    import datasets

    parts = {}
    for split, hub in HUB_SPLITS.items():
        rows = [r for r in _rows(annotations) if r["split"] == split]
        parts[hub] = datasets.Dataset.from_dict(
            {
                "filepath": [r["filepath"] for r in rows],
                "filename": [r["filename"] for r in rows],
                "sentences": [[s["raw"] for s in r["sentences"]] for r in rows],
                "split": [split] * len(rows),
                "cocoid": [r["imgid"] for r in rows],
                "url": [f"http://images.example/{r['filename']}" for r in rows],
            }
        )
    datasets.DatasetDict(parts).save_to_disk(str(out))


def flickr30k(annotations: Path, out: Path) -> None:
    """nlphuji/flickr30k: one Hub split ("test") holding every image, the Karpathy split in a column."""
    import datasets

    rows = _rows(annotations)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Sequence(datasets.Value("string")),
            "split": datasets.Value("string"),
            "img_id": datasets.Value("string"),
            "filename": datasets.Value("string"),
        }
    )
    table = {
        "image": [{"bytes": _bytes(annotations, r), "path": None} for r in rows],
        "caption": [[s["raw"] for s in r["sentences"]] for r in rows],
        "split": [r["split"] for r in rows],
        "img_id": [str(r["imgid"]) for r in rows],
        "filename": [r["filename"] for r in rows],
    }
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(table, features=features)}).save_to_disk(str(out))


def flickr8k(annotations: Path, out: Path) -> None:
    """jxie/flickr8k: image bytes, caption_0 ... caption_4, Hub splits."""
    import datasets

    parts = {}
    for split, hub in HUB_SPLITS.items():
        rows = [r for r in _rows(annotations) if r["split"] == split]
        table = {"image": [{"bytes": _bytes(annotations, r), "path": None} for r in rows]}
        for k in range(5):
            table[f"caption_{k}"] = [r["sentences"][k % len(r["sentences"])]["raw"] for r in rows]
        features = datasets.Features(
            {"image": datasets.Image(), **{f"caption_{k}": datasets.Value("string") for k in range(5)}}
        )
        parts[hub] = datasets.Dataset.from_dict(table, features=features)
    datasets.DatasetDict(parts).save_to_disk(str(out))


def build(annotations: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, writer in (("coco_karpathy", coco_karpathy), ("flickr30k", flickr30k), ("flickr8k", flickr8k)):
        if not (out / name).exists():
            writer(annotations, out / name)
            print(f"wrote {out / name}")
    if not (out / "shards").exists():
        from captioning.cli.main import main

        code = main(
            [
                "prepare",
                "--annotations",
                str(annotations),
                "--min-word-freq",
                "1",
                "--to-webdataset",
                str(out / "shards"),
            ]
        )
        if code:
            sys.exit(code)


def records(path: str, images_root: str | None):
    """(image_id, split, tokens, image bytes) of every record, in reading order."""
    from captioning.data.captions import CaptionData

    data = CaptionData(path, images_root)
    out = []
    for r in data.all_records():
        image = data.image_bytes(r)
        out.append((r.image_id, r.split, r.tokens, image))
    return out


def first_difference(ra: list, rb: list) -> str | None:
    if len(ra) != len(rb):
        return f"{len(ra)} records against {len(rb)}"
    for i, (x, y) in enumerate(zip(ra, rb)):
        for name, u, v in zip(("image_id", "split", "tokens", "image bytes"), x, y):
            if u != v:
                return f"record {i}: {name} {str(u)[:80]} against {str(v)[:80]}"
    return None


def compare(a: str, b: str, images_root_a: str | None, images_root_b: str | None) -> int:
    ra, rb = records(a, images_root_a), records(b, images_root_b)
    difference = first_difference(ra, rb)
    if difference is None:
        print(f"same records in the same order ({len(ra)} images): training from either is the same run")
        return 0
    if first_difference(sorted(ra, key=lambda r: r[0]), sorted(rb, key=lambda r: r[0])) is None:
        print(f"same records ({len(ra)} images) in another order (first difference in order: {difference})")
        return 0
    print(f"different: {difference}")
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build")
    p.add_argument("--annotations", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--images-root-a", default=None)
    p.add_argument("--images-root-b", default=None)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.annotations, args.out)
        return 0
    return compare(args.a, args.b, args.images_root_a, args.images_root_b)


if __name__ == "__main__":
    sys.exit(main())
