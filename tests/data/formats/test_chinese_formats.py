"""AI Challenger, Flickr8k(-CN) and COCO-CN as they ship: each reads a small file written here, is
detected by its content, and says what is wrong with a bad file in one line."""

import json

import pytest

from captioning.data.captions import CaptionData
from captioning.data.formats import default_images_root, detect_format, load_records
from captioning.errors import AnnotationError
from tests.helpers import write_jpeg

CAPTIONS = [
    "一个穿着红色衣服的女孩在草地上奔跑",
    "草地上有一个女孩在跑",
    "一个女孩在户外跑步",
    "女孩在草地上",
    "一个小女孩",
]


def aichallenger(root, split="train", date="20170902", n=3, item=None):
    images = root / f"caption_{split}_images_{date}"
    images.mkdir(parents=True, exist_ok=True)
    items = []
    for k in range(n):
        name = f"{k:040x}.jpg"
        write_jpeg(images / name, seed=k)
        items.append({"url": f"http://example.com/{name}", "image_id": name, "caption": CAPTIONS})
    if item is not None:
        items.append(item)
    path = root / f"caption_{split}_annotations_{date}.json"
    path.write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
    return path


def test_ai_challenger_files_read_as_they_ship(tmp_path):
    train, val = aichallenger(tmp_path, "train"), aichallenger(tmp_path, "validation", n=2)
    assert detect_format(str(train)) == "aichallenger"
    records = load_records([str(train), str(val)])
    assert [r.split for r in records] == ["train"] * 3 + ["val"] * 2
    assert records[0].path == f"caption_train_images_20170902/{0:040x}.jpg" and records[0].captions == CAPTIONS
    assert [r.image_id for r in records] == [0, 1, 2, 3, 4]
    data = CaptionData([str(train), str(val)], min_word_freq=1, image_size=32)
    data.setup()
    assert data.vocab.tokenizer.name in ("jieba", "chars") and next(iter(data.val_dataloader()))["images"].shape[0] == 2


def test_ai_challenger_read_as_its_archives_unpack(tmp_path):
    """The release unpacks into a dated folder per archive, each holding its file and its images
    folder; the two are read as they lie, side by side, from the folder that holds them."""
    train = aichallenger(tmp_path / "ai_challenger_caption_train_20170902", "train")
    val = aichallenger(tmp_path / "ai_challenger_caption_validation_20170910", "validation", date="20170910", n=2)
    records = load_records([str(train), str(val)])
    assert [r.split for r in records] == ["train"] * 3 + ["val"] * 2
    assert records[0].path == f"ai_challenger_caption_train_20170902/caption_train_images_20170902/{0:040x}.jpg"
    assert records[3].path == (
        f"ai_challenger_caption_validation_20170910/caption_validation_images_20170910/{0:040x}.jpg"
    )
    assert default_images_root([str(train), str(val)]) == str(tmp_path)
    data = CaptionData([str(train), str(val)], min_word_freq=1, image_size=32)
    data.setup()
    assert next(iter(data.val_dataloader()))["images"].shape[0] == 2  # the images found where they unpacked
    assert next(iter(data.train_dataloader()))["images"].shape[0] >= 1
    elsewhere = aichallenger(tmp_path / "somewhere" / "else", "validation", date="20170910", n=2)
    with pytest.raises(AnnotationError, match=r"in its dated folder .* side by side"):
        load_records([str(train), str(elsewhere)])


@pytest.mark.parametrize(
    "item, message",
    [
        ({"url": "x", "caption": ["一个女孩"]}, r"\[3\]: missing field 'image_id'"),
        ({"image_id": "a.jpg", "caption": 5}, r"\[3\]\.caption: expected a list of strings, got 5"),
        ({"image_id": 7, "caption": ["一个女孩"]}, r"\[3\]\.image_id: expected an image file name \(a string\), got 7"),
    ],
)
def test_a_bad_ai_challenger_entry_is_one_line(tmp_path, item, message):
    path = aichallenger(tmp_path, item=item)
    with pytest.raises(AnnotationError, match=message) as info:
        load_records(str(path))
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))
    problems = []
    assert len(load_records(str(path), problems=problems)) == 3 and len(problems) == 1  # listed, image left out


def test_ai_challenger_without_its_images_folder_or_split_in_the_name(tmp_path):
    path = aichallenger(tmp_path)
    (tmp_path / "caption_train_images_20170902").rename(tmp_path / "elsewhere")
    with pytest.raises(AnnotationError, match=r"no images folder caption_train_images_20170902/ beside it"):
        load_records(str(path))
    odd = tmp_path / "captions.json"
    odd.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(AnnotationError, match=r"captions.json: cannot tell the split from the file name"):
        load_records(str(odd))


def flickr8k(root, lines, lists=True):
    images = root / "Flicker8k_Dataset"
    for k in range(4):
        write_jpeg(images / f"{1000 + k}_abc.jpg", seed=k)
    if lists:
        for name, ids in (("train", [1000, 1001]), ("dev", [1002]), ("test", [1003])):
            (root / f"Flickr_8k.{name}Images.txt").write_text("".join(f"{i}_abc.jpg\n" for i in ids))
    path = root / "flickr8kzhc.caption.txt"
    path.write_bytes(lines.encode("utf-8") if isinstance(lines, str) else lines)
    return path


FLICKR8K_CN = "".join(f"{1000 + k}_abc#zhc#{n} {c}\n" for k in range(4) for n, c in enumerate(CAPTIONS[:3]))


def test_flickr8k_cn_reads_with_flickr8ks_split_lists(tmp_path):
    path = flickr8k(tmp_path, FLICKR8K_CN)
    assert detect_format(str(path)) == "flickr8k"
    assert default_images_root(str(path)) == str(tmp_path / "Flicker8k_Dataset")
    records = load_records(str(path))
    assert [(r.path, r.split) for r in records] == [
        ("1000_abc.jpg", "train"),
        ("1001_abc.jpg", "train"),
        ("1002_abc.jpg", "val"),
        ("1003_abc.jpg", "test"),
    ]
    assert records[0].captions == CAPTIONS[:3]
    english = tmp_path / "en" / "Flickr8k.token.txt"  # Flickr8k's own file: the same reader
    english.parent.mkdir()
    english.write_text("1000_abc.jpg#0\tA girl runs .\n1003_abc.jpg#0\tA girl .\n")
    assert [r.split for r in load_records(str(english))] == ["train", "test"]  # the lists in the parent folder


def test_bad_flickr8k_files_are_one_line(tmp_path):
    path = flickr8k(tmp_path, FLICKR8K_CN.encode("gb18030"))
    with pytest.raises(AnnotationError, match=r"flickr8kzhc.caption.txt: not UTF-8 text \(byte \d+\)"):
        load_records(str(path))
    path.write_text(FLICKR8K_CN + "1000_abc 一个女孩\n", encoding="utf-8")
    with pytest.raises(AnnotationError, match=r"line 13: expected '<image>#<n> <caption>'"):
        load_records(str(path))
    path.write_text(FLICKR8K_CN + "9_abc#zhc#0 一个女孩\n", encoding="utf-8")
    with pytest.raises(AnnotationError, match=r"image '9_abc' is in none of the split lists"):
        load_records(str(path))
    for name in ("train", "dev", "test"):
        (tmp_path / f"Flickr_8k.{name}Images.txt").unlink()
    with pytest.raises(AnnotationError, match=r"no split list Flickr_8k.trainImages.txt in "):
        load_records(str(path))


def test_coco_cn_reads_coco_ids_and_images(tmp_path):
    lines = "".join(
        f"COCO_{folder}_{i:012d}#{n}\t{c}\n"
        for folder, i in (("val2014", 42), ("train2014", 9))
        for n, c in enumerate(CAPTIONS[:2])
    )
    path = tmp_path / "imageid.human-written-caption.txt"
    path.write_text(lines, encoding="utf-8")
    (tmp_path / "coco-cn_train.txt").write_text("COCO_train2014_000000000009\n")
    (tmp_path / "coco-cn_val.txt").write_text("COCO_val2014_000000000042\n")
    (tmp_path / "coco-cn_test.txt").write_text("")
    assert detect_format(str(path)) == "coco_cn"
    records = load_records(str(path))
    assert [(r.image_id, r.path, r.split) for r in records] == [
        (9, "train2014/COCO_train2014_000000000009.jpg", "train"),
        (42, "val2014/COCO_val2014_000000000042.jpg", "val"),
    ]
    (tmp_path / "coco-cn_val.txt").unlink()
    with pytest.raises(AnnotationError, match=r"no split list coco-cn_val.txt in "):
        load_records(str(path))


def coco_cn(root, lines):
    path = root / "imageid.human-written-caption.txt"
    path.write_bytes(lines.encode("utf-8") if isinstance(lines, str) else lines)
    for split in ("train", "val", "test"):
        (root / f"coco-cn_{split}.txt").write_text("COCO_val2014_000000000042\n" if split == "train" else "")
    return path


COCO_CN = "".join(f"COCO_val2014_{42:012d}#{n}\t{c}\n" for n, c in enumerate(CAPTIONS[:2]))


def test_bad_coco_cn_and_ai_challenger_files_are_one_line(tmp_path):
    path = coco_cn(tmp_path, COCO_CN.encode("gb18030"))
    with pytest.raises(
        AnnotationError, match=r"imageid.human-written-caption.txt: not UTF-8 text \(byte \d+\)"
    ) as info:
        load_records(str(path))
    assert "\n" not in str(info.value)
    path.write_text(COCO_CN + "COCO_val2014_000000000042 一个女孩\n", encoding="utf-8")  # no '#<n>'
    with pytest.raises(AnnotationError, match=r"line 3: expected '<image>#<n> <caption>'"):
        load_records(str(path))
    path.write_text(COCO_CN + "val2014_42#0\t一个女孩\n", encoding="utf-8")
    with pytest.raises(
        AnnotationError, match=r"image 'val2014_42' is not a COCO image name \(COCO_<folder>_<12 digits>\)"
    ):
        load_records(str(path))
    problems = []
    assert len(load_records(str(path), problems=problems)) == 1 and len(problems) == 1  # listed, the rest read
    aic = aichallenger(tmp_path / "aic")
    aic.write_bytes(aic.read_text(encoding="utf-8").encode("gb18030"))
    with pytest.raises(AnnotationError, match=r"caption_train_annotations_20170902.json: not UTF-8 text") as info:
        load_records(str(aic))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fmt", ["flickr8k", "coco_cn"])
def test_prepare_without_the_images_folder_names_it_and_writes_nothing(fmt, tmp_path, capsys):
    """Flickr8k-CN's and COCO-CN's images live apart from the captions (Flicker8k_Dataset/, COCO's
    folders under --images-root): without them, prepare lists the missing images and ends in one
    line naming --images-root, writing no vocabulary."""
    from captioning.cli.main import main

    if fmt == "flickr8k":
        path = flickr8k(tmp_path, FLICKR8K_CN)
        for image in (tmp_path / "Flicker8k_Dataset").iterdir():
            image.unlink()
        (tmp_path / "Flicker8k_Dataset").rmdir()
    else:
        path = coco_cn(tmp_path, COCO_CN)
    out = tmp_path / "vocab.json"
    code = main(["prepare", "--annotations", str(path), "--min-word-freq", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and not out.exists()
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0] == err[-1], err
    assert "missing or unreadable" in err[-1] and "is --images-root" in err[-1]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("COCO_val2014_9223372036854775808", "its id is outside the 64-bit integers"),  # 2**63: crashed fit
        ("COCO_val2014_" + "7" * 5000, "its id is outside the 64-bit integers"),  # crashed prepare
        ("COCO_val2014_٤٢", "is not a COCO image name"),  # Arabic-Indic 42: was image 42 again
        ("COCO_val2014_42", "has the id 42 of image 'COCO_val2014_000000000042'"),  # one image, two names
    ],
)
def test_coco_cn_ids_are_ascii_digits_in_64_bits_once_each(tmp_path, name, expected):
    path = coco_cn(tmp_path, COCO_CN + f"{name}#0\t一个女孩\n")
    (tmp_path / "coco-cn_train.txt").write_text(f"COCO_val2014_000000000042\n{name}\n", encoding="utf-8")
    with pytest.raises(AnnotationError, match=expected) as info:
        load_records(str(path))
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    problems = []
    records = load_records(str(path), problems=problems)  # prepare lists it and reads the rest
    assert [r.image_id for r in records] == [42] and len(problems) == 1 and expected in problems[0]
