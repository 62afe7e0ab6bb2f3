"""The records as arrays (data/records.py): the datasets give the samples the records say, the
vocabulary counted from the caption table is the one counted from the tokens, and loader workers
start with the parent's objects frozen."""

import gc

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from captioning.data.captions import CaptionData
from captioning.data.datasets import CaptionGroupDataset, CaptionPairDataset, ImageDataset
from captioning.data.records import CaptionTable, ImageRecord, ImageRefs, StringArray
from captioning.data.sampling import SharingLoader
from captioning.vocab import Vocabulary
from tools.benchmarks.coco_scale import make as make_coco_like


@pytest.fixture(scope="module")
def coco_like(tmp_path_factory):
    """A COCO-like Karpathy file: 617 images, 5 captions each, Zipfian words (tools/benchmarks/coco_scale.py)."""
    return make_coco_like(tmp_path_factory.mktemp("coco"), scale=0.005)


def record(imgid, captions, split="train", path=None):
    tokens = [c.split() for c in captions]
    return ImageRecord(imgid, 1000 + imgid, path or f"images/{imgid}.jpg", split, list(captions), tokens)


def test_string_array_gives_back_every_string():
    strings = ["images/a.jpg", "", "caf\u00e9/\u732b.png", "bad\udcff name", "x" * 300]
    array = StringArray(strings)
    assert len(array) == 5 and [array[i] for i in range(5)] == strings


def test_caption_table_holds_the_records_tokens():
    records = [record(0, ["a red circle", "a circle"]), record(1, []), record(2, ["one square on the left"])]
    table = CaptionTable.of(records)
    assert len(table) == 3 and table.num_captions == 3
    assert table.lengths().tolist() == [3, 2, 5]
    assert table.record_of_caption().tolist() == [0, 0, 2]
    assert table.first_caption.tolist() == [0, 2, 2, 3]
    words = [[table.words[t] for t in table.tokens[table.starts[c] : table.starts[c + 1]]] for c in range(3)]
    assert words == [t for r in records for t in r.tokens]
    assert table.counts() == {"a": 2, "red": 1, "circle": 2, "one": 1, "square": 1, "on": 1, "the": 1, "left": 1}
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + ["circle", "a"])
    assert table.encode(vocab.stoi, vocab.unk_id).tolist() == [5, 3, 4, 5, 4, 3, 3, 3, 3, 3]


def test_an_empty_table():
    table = CaptionTable.of([])
    assert len(table) == 0 and table.num_captions == 0 and table.counts() == {}
    assert table.encode({}, 3).tolist() == [] and table.record_of_caption().tolist() == []


@pytest.mark.parametrize("data", ["tiny_shapes", "tiny_shapes_zh", "coco_like"])
@pytest.mark.parametrize("min_word_freq", [1, 5])
def test_one_pass_vocabulary_is_the_one_counted_from_the_tokens(data, min_word_freq, request):
    path = request.getfixturevalue(data)
    cut = CaptionData(str(path), min_word_freq=min_word_freq, max_vocab_size=20 if min_word_freq == 5 else None)
    cut.setup()
    train = cut.records("train")
    expected = Vocabulary.build(
        (t for r in train for t in r.tokens), min_word_freq, cut.max_vocab_size, tokenizer=cut.tokenizer
    )
    assert cut.vocab == expected and cut.vocab.min_freq == expected.min_freq and len(cut.vocab) > 8


def test_vocabulary_from_counts_is_build():
    captions = [["b", "a", "a"], ["c", "b", "<unk>", "a"], ["d"]]
    counts = CaptionTable.of([record(0, [" ".join(c) for c in captions])]).counts()
    for min_freq, size in ((1, None), (2, None), (1, 2), (1, 0)):
        assert Vocabulary.from_counts(counts, min_freq, size) == Vocabulary.build(captions, min_freq, size)
    assert Vocabulary.from_counts(counts, 1).itos[4:] == ["a", "b", "c", "d"]  # by count, ties alphabetical


@pytest.mark.parametrize("data", ["tiny_shapes", "coco_like"])
@pytest.mark.parametrize("max_length", [30, 4])
def test_datasets_give_the_samples_the_records_say(data, max_length, request, monkeypatch):
    """Every pair and every image's captions are the records' tokens as Vocabulary.encode gives them,
    for the record they belong to, in the records' order."""
    monkeypatch.setattr(ImageDataset, "visual", lambda self, ref: torch.tensor([ref.imgid, ref.image_id]))
    cd = CaptionData(str(request.getfixturevalue(data)), min_word_freq=2, max_length=max_length)
    cd.setup()
    train = cd.records("train")
    pairs = cd._dataset(CaptionPairDataset, "train", vocab=cd.vocab, max_length=max_length)
    expected = [(r, t) for r in train for t in r.tokens]
    assert len(pairs) == len(expected)
    for i, (r, tokens) in enumerate(expected):
        sample = pairs[i]
        assert sample["images"].tolist() == [r.imgid, r.image_id] and sample["image_ids"] == r.image_id
        assert sample["captions"].dtype == torch.long
        assert sample["captions"].tolist() == cd.vocab.encode(tokens, max_length)
    assert pairs.caption_lengths().tolist() == [min(len(t), max_length) for _, t in expected]
    groups = cd._dataset(CaptionGroupDataset, "train", vocab=cd.vocab, max_length=max_length)
    assert len(groups) == len(train)
    for i, r in enumerate(train):
        assert [c.tolist() for c in groups[i]["captions"]] == [cd.vocab.encode(t, max_length) for t in r.tokens]
    val = cd._dataset(ImageDataset, "val")
    assert [val[i]["image_ids"] for i in range(len(val))] == [r.image_id for r in cd.records("val")]


def test_image_refs_are_the_records():
    records = [record(0, ["a"], path="x/\u732b.jpg"), record(7, ["b"], split="val")]
    refs = ImageRefs(records)
    assert len(refs) == 2 and refs[1] == (7, 1007, "images/7.jpg") and refs[0].path == "x/\u732b.jpg"
    assert isinstance(refs[1].image_id, int) and refs.image_id.dtype == np.int64


class _FrozenInWorker(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return gc.get_freeze_count()


def test_workers_start_with_the_parents_objects_frozen():
    """A worker's garbage collections skip what it shares with its parent; the parent's are thawed."""
    before = gc.get_freeze_count()
    counts = [int(b) for b in SharingLoader(_FrozenInWorker(), batch_size=1, num_workers=1)]
    assert min(counts) > 1000 and gc.get_freeze_count() == before
    assert [int(b) for b in SharingLoader(_FrozenInWorker(), batch_size=1, num_workers=0)] == [before, before]
