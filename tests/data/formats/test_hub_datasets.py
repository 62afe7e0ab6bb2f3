"""Hub datasets (the ``datasets`` library) as annotations: the shapes data saved with save_to_disk in
the layouts of yerevann/coco-karpathy, nlphuji/flickr30k and jxie/flickr8k, read, trained on and
evaluated; problems listed by `prepare`; a Hub name that is not cached, offline. Nothing is downloaded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.data.formats import default_images_root, detect_format, load_records
from captioning.data.formats.karpathy import load_karpathy
from captioning.errors import AnnotationError
from tests.helpers import fit_args

datasets = pytest.importorskip("datasets", reason="the ecosystem extra: pip install -e '.[ecosystem]'")

HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}


@pytest.fixture(autouse=True)
def image_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CAPTIONING_IMAGE_CACHE", str(tmp_path_factory.getbasetemp() / "image_cache"))


def shapes_rows(tiny_shapes):
    """(split, Karpathy image entry) of the tiny shapes data."""
    return [(img["split"], img) for img in json.loads(tiny_shapes.read_text())["images"]]


def image_bytes(tiny_shapes, img) -> bytes:
    return (tiny_shapes.parent / img["filepath"] / img["filename"]).read_bytes()


def coco_karpathy(tiny_shapes, out: Path) -> Path:
    """yerevann/coco-karpathy: no image bytes, Hub splits train/validation/test, sentences as strings."""
    parts = {}
    for split, hub in HUB_SPLITS.items():
        rows = [img for s, img in shapes_rows(tiny_shapes) if s == split]
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
    return out


def flickr30k(tiny_shapes, out: Path) -> Path:
    """nlphuji/flickr30k: one Hub split ("test") holding everything, the Karpathy split in a column."""
    rows = shapes_rows(tiny_shapes)
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
        "image": [{"bytes": image_bytes(tiny_shapes, r), "path": None} for _, r in rows],
        "caption": [[s["raw"] for s in r["sentences"]] for _, r in rows],
        "split": [s for s, _ in rows],
        "img_id": [str(r["imgid"]) for _, r in rows],
        "filename": [r["filename"] for _, r in rows],
    }
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(table, features=features)}).save_to_disk(str(out))
    return out


def flickr8k(tiny_shapes, out: Path) -> Path:
    """jxie/flickr8k: image bytes, caption_0 ... caption_4, Hub splits."""
    parts = {}
    for split, hub in HUB_SPLITS.items():
        rows = [img for s, img in shapes_rows(tiny_shapes) if s == split]
        table = {"image": [{"bytes": image_bytes(tiny_shapes, r), "path": None} for r in rows]}
        for k in range(5):
            table[f"caption_{k}"] = [r["sentences"][k % len(r["sentences"])]["raw"] for r in rows]
        features = datasets.Features(
            {"image": datasets.Image(), **{f"caption_{k}": datasets.Value("string") for k in range(5)}}
        )
        parts[hub] = datasets.Dataset.from_dict(table, features=features)
    datasets.DatasetDict(parts).save_to_disk(str(out))
    return out


LAYOUTS = {"coco_karpathy": coco_karpathy, "flickr30k": flickr30k, "flickr8k": flickr8k}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def saved(request, tiny_shapes, tmp_path_factory):
    """(layout, save_to_disk folder, images root to pass or None)."""
    folder = LAYOUTS[request.param](tiny_shapes, tmp_path_factory.mktemp("hub") / request.param)
    return request.param, folder, (str(tiny_shapes.parent) if request.param == "coco_karpathy" else None)


def test_records_match_the_karpathy_file(saved, tiny_shapes):
    layout, folder, images_root = saved
    assert detect_format(folder) == "hub"
    records = load_records(str(folder))
    expected = {r.imgid: r for r in load_karpathy(tiny_shapes)}
    assert len(records) == len(expected) == 56
    for r in records:
        e = expected[r.image_id]
        assert r.split == e.split
        if layout == "flickr8k":  # five caption columns, the shapes images have five captions
            assert sorted(r.captions) == sorted(e.captions)
        else:
            assert r.captions == e.captions
        root = images_root or default_images_root(str(folder))
        assert Path(root, r.path).read_bytes() == (tiny_shapes.parent / e.path).read_bytes()


def test_fit_and_evaluate(saved, tmp_path):
    from captioning.training.cli import run_lightning_cli

    layout, folder, images_root = saved
    extra = ["--data.images_root", images_root] if images_root else []
    cli = run_lightning_cli(fit_args(folder, tmp_path, extra=extra))
    assert cli.trainer.global_step == 2
    checkpoint = cli.trainer.checkpoint_callback.last_model_path
    results = tmp_path / "results.json"
    more = ["--images-root", images_root] if images_root else []
    assert (
        main(
            [
                "evaluate",
                "--checkpoint",
                checkpoint,
                "--annotations",
                str(folder),
                "--split",
                "test",
                "--num-beams",
                "1",
                "--max-new-tokens",
                "6",
                "--results",
                str(results),
                *more,
            ]
        )
        == 0
    )
    assert len(json.loads(results.read_text())) == 8


def test_images_outside_the_dataset_need_the_images_root(tiny_shapes, tmp_path):
    folder = coco_karpathy(tiny_shapes, tmp_path / "coco")
    with pytest.raises(AnnotationError) as err:
        default_images_root(str(folder))
    assert "never fetched" in str(err.value) and "--data.images_root" in str(err.value) and "\n" not in str(err.value)


def test_column_mapping_for_another_layout(tiny_shapes, tmp_path):
    rows = shapes_rows(tiny_shapes)
    datasets.Dataset.from_dict(
        {
            "picture": [image_bytes(tiny_shapes, r) for _, r in rows],
            "text": [r["sentences"][0]["raw"] for _, r in rows],
            "fold": [{"val": "validation"}.get(s, s) for s, _ in rows],
            "key": [r["imgid"] for _, r in rows],
        }
    ).save_to_disk(str(tmp_path / "pets"))
    with pytest.raises(AnnotationError) as err:
        load_records(str(tmp_path / "pets"))
    assert "unknown dataset layout" in str(err.value) and "?image=COLUMN" in str(err.value)
    records = load_records(f"{tmp_path / 'pets'}?image=picture&captions=text&split=fold&id=key")
    assert len(records) == 56 and {r.split for r in records} == {"train", "val", "test"}
    assert records[0].captions == [rows[0][1]["sentences"][0]["raw"]]


def test_prepare_lists_every_problem(tiny_shapes, tmp_path, capsys):
    rows = shapes_rows(tiny_shapes)[:6]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "caption": datasets.Sequence(datasets.Value("string")),
            "split": datasets.Value("string"),
        }
    )
    images = [{"bytes": image_bytes(tiny_shapes, r), "path": None} for _, r in rows]
    images[1] = {"bytes": b"%!PS-Adobe-3.0 EPSF-3.0\n", "path": None}  # refused format
    captions = [[s["raw"] for s in r["sentences"]] for _, r in rows]
    captions[2] = ["", "  "]  # no usable caption
    splits = [s for s, _ in rows]
    splits[3] = "holdout"  # unknown split
    datasets.Dataset.from_dict({"image": images, "caption": captions, "split": splits}, features=features).save_to_disk(
        str(tmp_path / "bad")
    )
    assert main(["prepare", "--annotations", str(tmp_path / "bad")]) == 1
    err = capsys.readouterr().err
    assert "row 1: image: not an image of an accepted format" in err
    assert "row 2: no usable captions" in err and "row 3: unknown split 'holdout'" in err
    assert "3 image(s) or row(s) of the annotation file have problems" in err


def test_hub_name_offline_and_not_cached_is_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [sys.executable, "-m", "captioning.cli", "prepare", "--annotations", "hf://nobody/no-such-captions@main"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "could not load the dataset nobody/no-such-captions" in lines[0], proc.stderr


def test_extract_features_from_a_saved_dataset(tiny_shapes, tmp_path, capsys):
    import yaml

    from tests.helpers import ROOT

    pytest.importorskip("timm", reason="the ecosystem extra")
    folder = flickr8k(tiny_shapes, tmp_path / "flickr8k")
    cfg = yaml.safe_load((ROOT / "configs" / "shapes_soft.yaml").read_text())
    cfg["model"]["encoder"] = {"name": "timm:resnet18", "pretrained": False}
    cfg["data"].update(annotations=str(folder), num_workers=0)
    cfg["data"].pop("images_root", None)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "feats"
    assert (
        main(
            [
                "extract-features",
                "--config",
                str(tmp_path / "cfg.yaml"),
                "--out",
                str(out),
                "--batch-size",
                "8",
                "--num-workers",
                "0",
            ]
        )
        == 0
    )
    assert "56 of 56 images done" in capsys.readouterr().out
