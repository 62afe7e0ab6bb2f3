"""The annotation-format registry: detection order, one-line errors listing the formats, and a new
format (defined here, in one class) read by CaptionData through detection and by name."""

import json
from pathlib import Path

import pytest
import torch

from captioning.data.captions import CaptionData
from captioning.data.formats import default_images_root, detect_format, list_formats, load_records, read_annotations
from captioning.data.formats.base import FORMATS, AnnotationFormat, image_path
from captioning.data.records import ImageRecord
from captioning.errors import AnnotationError, ConfigError
from captioning.tokenizers import tokenize
from tests.helpers import write_jpeg


@FORMATS.register("toy-tsv")
class ToyFormat(AnnotationFormat):
    """``split<TAB>image<TAB>caption`` lines, one caption each (a format a user adds in one file)."""

    description = "a toy TSV file"

    def detect(self, path):
        return path.endswith(".toy")

    def load(self, paths, split_file, merge_restval, problems):
        records: dict[str, ImageRecord] = {}
        for line in Path(paths[0]).read_text().splitlines():
            split, image, caption = line.split("\t")
            rel = image_path(paths[0], image, image)
            rec = records.setdefault(rel, ImageRecord(len(records), len(records), rel, split, [], []))
            rec.captions.append(caption)
            rec.tokens.append(tokenize(caption))
        return list(records.values())

    def default_images_root(self, path):
        return str(Path(path).parent / "pictures")


def toy_dataset(tmp_path: Path, name: str = "data.toy") -> Path:
    lines = []
    for i, split in enumerate(["train"] * 4 + ["val", "test"]):
        write_jpeg(tmp_path / "pictures" / f"{i}.jpg", seed=i)
        lines += [f"{split}\t{i}.jpg\ta red circle", f"{split}\t{i}.jpg\ta blue square"]
    path = tmp_path / name
    path.write_text("\n".join(lines))
    return path


def test_the_builtin_formats_are_asked_in_priority_order():
    builtin = [n for n in list_formats() if n != "toy-tsv"]
    assert builtin == ["hub", "webdataset", "folder", "aichallenger", "flickr8k", "coco_cn", "coco", "karpathy"]
    assert list_formats()[-1] == "karpathy"  # the fallback (any other file) is asked last
    priorities = [FORMATS.get(n).priority for n in list_formats()]
    assert priorities == sorted(priorities)


def test_detection_of_each_builtin_format(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps({"images": []}))
    (tmp_path / "c.json").write_text(json.dumps({"images": [], "annotations": []}))
    (tmp_path / "s.tar").write_bytes(b"")
    assert detect_format(tmp_path / "k.json") == "karpathy" and detect_format(tmp_path / "c.json") == "coco"
    assert detect_format(tmp_path / "x.csv") == "folder" and detect_format(tmp_path / "x.jsonl") == "folder"
    assert detect_format(tmp_path / "s.tar") == "webdataset" and detect_format("hf://owner/name") == "hub"
    with pytest.raises(AnnotationError, match="none.json: no such file$"):
        detect_format(tmp_path / "none.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(AnnotationError, match="empty.json: empty file$"):
        detect_format(tmp_path / "empty.json")


def test_an_unknown_format_name_is_one_line_listing_the_registered_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_records(tmp_path / "k.json", format="parquet")
    message = str(info.value)
    assert "\n" not in message and message.startswith("format: unknown annotation format 'parquet'")
    for name in ("karpathy", "coco", "folder", "hub", "webdataset", "toy-tsv"):
        assert name in message


def test_split_files_and_several_files_are_refused_by_formats_that_take_none(tmp_path):
    toy = toy_dataset(tmp_path)
    with pytest.raises(AnnotationError, match="split file only applies to COCO caption files, not to a toy TSV file"):
        load_records(toy, split_file=tmp_path / "split.json")
    with pytest.raises(
        AnnotationError,
        match="only supported for WebDataset shards or AI Challenger caption files or COCO caption files",
    ):
        load_records([toy, toy])


def test_a_registered_format_is_read_by_detection(tmp_path):
    toy = toy_dataset(tmp_path)
    assert detect_format(toy) == "toy-tsv"
    assert default_images_root(toy) == str(tmp_path / "pictures")
    records = load_records(toy)
    assert [r.split for r in records] == ["train"] * 4 + ["val", "test"]
    assert records[0].tokens == [["a", "red", "circle"], ["a", "blue", "square"]]

    data = CaptionData(str(toy), batch_size=2, image_size=32, min_word_freq=1)
    data.setup("fit")
    assert data.images_root == str(tmp_path / "pictures")
    assert data.vocab.itos[4:] == ["a", "blue", "circle", "red", "square"]
    batch = next(iter(data.train_dataloader()))
    assert batch["images"].shape == (2, 3, 32, 32) and batch["captions"].shape == (2, 5)
    val = next(iter(data.val_dataloader()))
    assert val["image_ids"].tolist() == [4] and val["images"].shape == (1, 3, 32, 32)
    assert data.read_image(records[5]).size == (56, 48)  # write_jpeg: (size + 8) x size
    assert data.image_bytes(records[5]) == (tmp_path / "pictures" / "5.jpg").read_bytes()


def test_a_registered_format_is_read_by_name_whatever_the_path(tmp_path):
    toy = toy_dataset(tmp_path, name="data.txt")  # no suffix a format detects
    assert detect_format(toy) == "karpathy"  # the fallback, which would fail to read it
    annotations = read_annotations(toy, format="toy-tsv")
    assert len(annotations.records) == 6
    sample = annotations.image_dataset(annotations.records[:1], str(tmp_path / "pictures"), 16)[0]
    assert sample["image_ids"] == 0 and isinstance(sample["images"], torch.Tensor)
