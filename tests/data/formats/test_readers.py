"""Real-dataset readers (Karpathy, raw COCO, captions folder), format dispatch, and `captioning prepare`,
on tiny datasets of real JPEGs written here."""

import csv
import json
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.data.datamodule import CaptionDataModule
from captioning.data.formats import detect_format, load_records
from captioning.data.formats.coco import load_coco
from captioning.data.formats.folder import load_folder
from captioning.data.formats.karpathy import load_karpathy
from captioning.errors import AnnotationError
from tests.helpers import make_coco, make_karpathy, write_jpeg


@pytest.fixture
def coco(tmp_path):
    return make_coco(tmp_path)


def test_coco_without_split_file_takes_splits_from_file_names(coco):
    train, val, _ = coco
    records = load_coco([train, val])
    assert [r.image_id for r in records] == list(range(1, 11))
    assert {r.split for r in records if r.image_id <= 6} == {"train"} and records[-1].split == "val"
    assert records[0].path == "train2014/COCO_train2014_000000000001.jpg"
    assert len(records[0].captions) == 2 and records[0].tokens[0][-1] != "."  # tokenised, punctuation dropped
    assert records[0].width == 56


def test_coco_with_karpathy_split_file(coco):
    train, val, split = coco
    records = load_coco([train, val], split_file=split)
    assert {r.image_id: r.split for r in records} == {
        1: "train",
        2: "train",
        3: "train",
        4: "train",
        7: "train",
        8: "val",
        9: "test",
        10: "test",
    }  # 5, 6 not listed: left out
    assert load_coco([train, val], split, merge_restval=False)[2].split == "restval"
    with pytest.raises(AnnotationError, match="4 cocoid.*in no caption file"):
        load_coco(train, split_file=split)  # val2014 missing


def test_coco_errors(tmp_path, coco):
    train, _, _ = coco
    bad = tmp_path / "captions_train2014.json"
    bad.write_text('{"images": [], "annotations": [')
    with pytest.raises(AnnotationError, match="malformed JSON"):
        load_coco(bad)
    bad.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": []}))
    with pytest.raises(AnnotationError, match="image 1 .*no usable captions"):
        load_coco(bad)
    with pytest.raises(AnnotationError, match="also in"):
        load_coco([train, train])


def test_folder_csv_and_jsonl(tmp_path):
    for i in range(3):
        write_jpeg(tmp_path / f"{i}.jpg", i)
    with open(tmp_path / "captions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "caption"])
        w.writerows([["0.jpg", "A dog, running."], ["1.jpg", "a cat"], ["0.jpg", "a brown dog"], ["2.jpg", "a mat"]])
    records = load_folder(tmp_path / "captions.csv")
    assert [(r.path, len(r.captions)) for r in records] == [("0.jpg", 2), ("1.jpg", 1), ("2.jpg", 1)]
    assert sorted(r.split for r in records) == ["test", "train", "val"]  # no split column: one each held out
    assert records[0].tokens[0] == ["a", "dog", "running"]
    rows = [
        {"image": "0.jpg", "caption": "a dog", "split": "train"},
        {"image": "1.jpg", "caption": "a cat", "split": "val"},
        {"image": "2.jpg", "caption": "a mat", "split": "test"},
    ]
    (tmp_path / "captions.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [r.split for r in load_records(tmp_path / "captions.jsonl")] == ["train", "val", "test"]


def test_a_file_without_splits_holds_out_a_seeded_tenth_for_val_and_test(tmp_path, capsys):
    rows = [f"{i}.jpg,a picture of thing {i}" for i in range(40)]
    (tmp_path / "c.csv").write_text("image,caption\n" + "\n".join(rows) + "\n")
    first = [(r.path, r.split) for r in load_folder(tmp_path / "c.csv")]
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "no split column: 4 of 40 images held out for val and 4 for test (seed 0)" in said[0]
    assert [s for _, s in first].count("val") == 4 and [s for _, s in first].count("test") == 4
    assert [(r.path, r.split) for r in load_folder(tmp_path / "c.csv")] == first  # the same parts every run
    capsys.readouterr()
    (tmp_path / "d.csv").write_text("image,caption,split\n" + "\n".join(r + ",train" for r in rows) + "\n")
    assert {r.split for r in load_folder(tmp_path / "d.csv")} == {"train"}  # a split column is taken as it is
    assert "held out" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        ("image,text\n0.jpg,a dog\n", "no column 'caption'"),
        ("image,caption,split\n0.jpg,a dog,training\n", "line 2: unknown split 'training'"),
        ("image,caption\n0.jpg,\n", "without a usable caption"),
        ("image,caption,split\n0.jpg,a dog,train\n0.jpg,a cat,val\n", "line 3: 0.jpg is in split 'val'"),
    ],
)
def test_folder_errors(tmp_path, content, message):
    (tmp_path / "c.csv").write_text(content)
    with pytest.raises(AnnotationError, match=message):
        load_folder(tmp_path / "c.csv")


def test_folder_jsonl_malformed(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"image": "a.jpg", "caption": "a dog"}\n{"image": \n')
    with pytest.raises(AnnotationError, match="line 2: malformed JSON"):
        load_folder(tmp_path / "c.jsonl")


def test_format_dispatch(tmp_path, coco):
    karpathy = make_karpathy(tmp_path / "k")
    assert detect_format(karpathy) == "karpathy" and detect_format(coco[0]) == "coco"
    assert detect_format(tmp_path / "x.csv") == "folder"
    assert [r.path for r in load_records(karpathy)] == [r.path for r in load_karpathy(karpathy)]
    with pytest.raises(AnnotationError, match="split file only applies to COCO"):
        load_records(karpathy, split_file=coco[2])


def test_datamodule_reads_coco_and_folder(tmp_path, coco):
    train, val, split = coco
    dm = CaptionDataModule(
        [str(train), str(val)],
        images_root=str(tmp_path),
        split_file=str(split),
        batch_size=4,
        image_size=32,
        min_word_freq=1,
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape == (4, 3, 32, 32) and len(dm.records("test")) == 2
    assert set(dm.references("val")) == {8}


def test_prepare_reports_and_writes_vocab(tmp_path, capsys):
    ann = make_karpathy(tmp_path)
    status = main(["prepare", "--annotations", str(ann), "--min-word-freq", "1", "--out", str(tmp_path / "vocab.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "train" in out and "12 images" in out and "36 captions" in out
    assert "all 20 images readable" in out and "caption length (words): min 3" in out and "#" in out
    assert json.loads((tmp_path / "vocab.json").read_text())


def test_prepare_lists_every_bad_image(tmp_path, capsys):
    ann = make_karpathy(tmp_path)
    (tmp_path / "images" / "3.jpg").unlink()
    (tmp_path / "images" / "5.jpg").write_bytes(b"not a jpeg")
    data = (tmp_path / "images" / "7.jpg").read_bytes()
    (tmp_path / "images" / "7.jpg").write_bytes(data[: len(data) // 2])
    assert main(["prepare", "--annotations", str(ann)]) == 1
    err = capsys.readouterr().err
    for name, why in (("3.jpg", "no such file"), ("5.jpg", "not an image"), ("7.jpg", "truncated")):
        assert any(name in line and why in line for line in err.splitlines()), err
    assert "3 of 20 images are missing or unreadable" in err


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["images"][0].update(split="training"), r"images\[0\]\.split: unknown split .training."),
        (lambda d: d["images"][1].update(sentences=[]), r"images\[1\] .*no usable captions"),
        (None, "malformed JSON"),
    ],
)
def test_prepare_annotation_problems(tmp_path, capsys, change, message):
    ann = make_karpathy(tmp_path, n_train=2, n_val=1, n_test=1)
    if change is None:
        ann.write_text(ann.read_text()[:-20])
    else:
        data = json.loads(ann.read_text())
        change(data)
        ann.write_text(json.dumps(data))
    assert main(["prepare", "--annotations", str(ann)]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in err
    import re

    assert re.search(message, err), err


def test_prepare_reports_five_problems_in_one_run_and_writes_nothing(tmp_path, capsys):
    ann = make_karpathy(tmp_path)
    data = json.loads(ann.read_text())
    data["images"][1]["sentences"] = []  # 1. no captions
    data["images"][2]["split"] = "training"  # 2. an unknown split
    del data["images"][4]["filename"]  # 3. a missing field
    data["images"][6]["imgid"] = data["images"][5]["imgid"]  # 4. listed twice
    ann.write_text(json.dumps(data))
    (tmp_path / "images" / "9.jpg").unlink()  # 5. a missing image file
    vocab = tmp_path / "vocab.json"
    assert main(["prepare", "--annotations", str(ann), "--min-word-freq", "1", "--out", str(vocab)]) == 1
    err = capsys.readouterr().err
    for expected in (
        "images[1] (images/1.jpg): no usable captions",
        "images[2].split: unknown split 'training'",
        "images[4]: missing field 'filename'",
        "images[6]: image listed twice (imgid 5",
        "9.jpg: no such file",
    ):
        assert err.count(expected) == 1, (expected, err)  # each problem, once
    assert not vocab.exists()  # nothing is written when the check fails


def test_prepare_reports_every_problem_of_coco_caption_files(tmp_path, capsys, coco):
    train, val, split = coco
    data = json.loads(train.read_text())
    data["annotations"][0] = {"id": 1, "caption": "no image id"}  # 1. a malformed annotation
    for ann in data["annotations"]:
        if ann.get("image_id") == 2:
            ann["caption"] = "  ."  # 2. an image without a usable caption
    other = json.loads(val.read_text())  # 3. image 7 also in the val file
    data["images"].append(other["images"][0])
    data["annotations"] += [a for a in other["annotations"] if a["image_id"] == 7]
    train.write_text(json.dumps(data))
    vocab = tmp_path / "vocab.json"
    code = main(
        [
            "prepare",
            "--annotations",
            str(train),
            str(val),
            "--split-file",
            str(split),
            "--min-word-freq",
            "1",
            "--out",
            str(vocab),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    for expected in (
        "annotations[0]: expected an object with 'id', 'image_id' and 'caption'",
        "image 2 (train2014/COCO_train2014_000000000002.jpg): no usable captions",
        "image 7 is also in",
    ):
        assert err.count(expected) == 1, (expected, err)  # each problem, once, in one run
    assert "in no caption file" not in err  # image 2 is reported for its own problem, not as missing
    assert not vocab.exists()


# the paper's recipe on each dataset (the configs of other backbones, e.g. coco_clip_vitb16.yaml, are
# tests/models/test_timm_encoders.py's)
REAL_CONFIGS = sorted(
    p.name
    for p in (Path(__file__).resolve().parents[3] / "configs").glob("*.yaml")
    if p.stem.split("_")[0] in ("flickr8k", "flickr30k", "coco") and p.stem.split("_")[-1] in ("soft", "hard")
)


def test_real_dataset_configs_exist():
    assert REAL_CONFIGS == [f"{d}_{k}.yaml" for d in ("coco", "flickr30k", "flickr8k") for k in ("hard", "soft")]


@pytest.mark.parametrize("config", REAL_CONFIGS)
def test_real_dataset_config_fits_one_step(config, tmp_path_factory):
    """Each config parses, builds its module and datamodule on tiny JPEG data and takes a fit step."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    root = tmp_path_factory.mktemp(config.split(".")[0])
    ann = make_karpathy(root, n_train=6, n_val=2, n_test=2)
    cli = run_lightning_cli(
        fit_args(
            ann,
            root / "run",
            config=config,
            steps=1,
            extra=[
                "--model.encoder.pretrained",
                "false",
                "--model.encoder.grid_size",
                "2",
                "--data.image_size",
                "64",
                "--data.min_word_freq",
                "1",
                "--data.images_root",
                str(root),
                "--data.pin_memory",
                "false",
                "--model.val_generation.max_new_tokens",
                "4",
                "--model.test_generation.max_new_tokens",
                "4",
                "--data.eval_batch_size",
                "2",
                "--trainer.devices",
                "1",
                "--trainer.max_steps",
                "1",
            ],
        )
    )
    h = cli.model.hparams
    assert cli.trainer.global_step == 1
    kind = config.split("_")[1].split(".")[0]
    assert (h.encoder["name"], h.optimizer["lr"], h.decoder["dropout"], h.decoder["attention_kind"]) == (
        "resnet101",
        2e-4,
        0.5,
        kind,
    )
    objective = h.objective["init_args"]
    assert objective["doubly_stochastic"] == 1.0
    assert h.objective["class_path"].endswith("HardAttentionReinforce" if kind == "hard" else "CrossEntropy")
    if kind == "hard":
        assert (objective["lambda_r"], objective["lambda_e"], objective["semi_sampling_p"]) == (0.1, 0.002, 0.5)
    assert cli.datamodule.min_word_freq == 1 and cli.datamodule.batch_size == 8


def test_values_of_valid_json_no_later_step_can_use(tmp_path):
    """A lone surrogate (JSON's escapes can spell one), an id past int64 and more digits than Python
    converts are one line at reading, in every JSON reader (before: failures when a vocabulary or
    results file was written, or in the collate's torch.tensor)."""

    def error(load, path) -> str:
        with pytest.raises(AnnotationError) as err:
            load(path)
        assert "\n" not in str(err.value) and str(path) in str(err.value)
        return str(err.value)

    rows = tmp_path / "captions.jsonl"
    rows.write_text(json.dumps({"image": "a.jpg", "caption": "a red \ud800 circle"}) + "\n")
    assert "line 1: field 'caption': a lone surrogate" in error(load_folder, rows)
    rows.write_text('{"image": "a.jpg", "caption": "a", "n": ' + "1" * 5000 + "}\n")
    assert "line 1: unreadable JSON" in error(load_folder, rows)
    coco = tmp_path / "captions_val2014.json"
    coco.write_text(
        json.dumps(
            {
                "images": [{"id": 2**63, "file_name": "a.jpg"}],
                "annotations": [{"id": 1, "image_id": 2**63, "caption": "a dog"}],
            }
        )
    )
    assert "annotations[0].image_id: 9223372036854775808 is outside the 64-bit" in error(load_coco, coco)
    coco.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.jpg"}],
                "annotations": [{"id": 1, "image_id": 1, "caption": "a \udfff dog"}],
            }
        )
    )
    assert "annotations[0].caption: a lone surrogate" in error(load_coco, coco)
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a\ud800.jpg"}], "annotations": []}))
    assert "image 1: image path: a lone surrogate" in error(load_coco, coco)
