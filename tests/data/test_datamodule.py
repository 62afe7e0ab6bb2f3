import json

import lightning as L
import pytest
import torch
from PIL import Image

from captioning.data.datamodule import CaptionDataModule
from captioning.data.datasets import Collate
from captioning.errors import AnnotationError, ConfigError, ImageError
from captioning.vocab import Vocabulary

# imgid -> (split, captions); every caption of train + restval counts towards the vocabulary
TINY_CAPTIONS = {
    0: ("train", ["a red circle", "a red circle on the left"]),
    1: ("train", ["a blue square", "a blue square on the right", "one blue square"]),
    2: ("train", ["a small red circle near a big blue square in the middle"]),
    3: ("restval", ["a green circle", "a green circle in the middle"]),
    4: ("val", ["a red square", "a square that is red", "the red square"]),
    5: ("val", ["a blue circle", "the blue circle"]),
    6: ("test", ["a green square"]),
}


@pytest.fixture
def tiny_karpathy(tmp_path):
    """A 7-image Karpathy file with images of assorted sizes and modes under tmp_path/images."""
    (tmp_path / "images").mkdir()
    modes = ["RGB", "L", "RGBA", "P", "RGB", "CMYK", "RGB"]
    images = []
    for imgid, (split, captions) in TINY_CAPTIONS.items():
        name = f"{imgid}.{'jpg' if modes[imgid] in ('L', 'CMYK') else 'png'}"
        Image.new(modes[imgid], (20 + 5 * imgid, 16)).save(tmp_path / "images" / name)
        sentences = [{"tokens": c.split(), "raw": c.capitalize() + "."} for c in captions]
        images.append(
            {
                "filepath": "images",
                "filename": name,
                "imgid": imgid,
                "cocoid": 100 + imgid,
                "split": split,
                "sentences": sentences,
            }
        )
    path = tmp_path / "dataset_tiny.json"
    path.write_text(json.dumps({"images": images}))
    return path


def tiny_dm(path, **kwargs):
    kwargs = {"batch_size": 3, "image_size": 16, "min_word_freq": 2, **kwargs}
    dm = CaptionDataModule(str(path), **kwargs)
    dm.setup("fit")
    return dm


def test_setup_builds_vocabulary_from_train_and_restval(tiny_karpathy):
    dm = tiny_dm(tiny_karpathy)
    assert dm.images_root == str(tiny_karpathy.parent)
    assert "green" in dm.vocab  # only in restval (twice)
    assert "small" not in dm.vocab and "that" not in dm.vocab  # once in train; only in val
    assert [r.image_id for r in dm.records("train")] == [100, 101, 102, 103]
    assert dm.references("val") == {
        104: ["A red square.", "A square that is red.", "The red square."],
        105: ["A blue circle.", "The blue circle."],
    }


def test_setup_reads_no_image(tmp_path, tiny_karpathy):
    for image in (tiny_karpathy.parent / "images").iterdir():
        image.unlink()
    dm = tiny_dm(tiny_karpathy)  # only the annotation file is read
    assert len(dm.vocab) > 4 and len(dm.references("test")) == 1


def test_train_batches_pad_captions(tiny_karpathy):
    dm = tiny_dm(tiny_karpathy)
    seen = []
    for batch in dm.train_dataloader():
        images, captions, lengths = batch["images"], batch["captions"], batch["lengths"]
        B, T = captions.shape
        assert images.shape == (B, 3, 16, 16) and images.dtype == torch.float32
        assert lengths.dtype == captions.dtype == batch["image_ids"].dtype == torch.long
        assert T == int(lengths.max()) and B <= 3 and batch["bad_images"] == []
        for row, n in zip(captions, lengths.tolist()):
            assert row[0] == dm.vocab.bos_id and row[n - 1] == dm.vocab.eos_id
            assert (row[n:] == dm.vocab.pad_id).all() and (row[1 : n - 1] > dm.vocab.eos_id).all()
            seen.append(" ".join(dm.vocab.decode(row)))
        assert set(batch["image_ids"].tolist()) <= {100, 101, 102, 103}
    assert len(seen) == 8  # one sample per (image, caption) pair, restval included
    assert "a red circle on the <unk>" in seen  # "left" is seen once only
    assert "a <unk> red circle <unk> a <unk> blue square in the middle" in seen


def test_captions_are_cut_to_max_length(tiny_karpathy):
    dm = tiny_dm(tiny_karpathy, max_length=4, batch_size=8)
    batch = next(iter(dm.train_dataloader()))
    assert batch["captions"].shape[1] == 4 + 2 and int(batch["lengths"].max()) == 6


def test_eval_loaders_give_one_sample_per_image(tiny_karpathy):
    dm = tiny_dm(tiny_karpathy, eval_batch_size=1)
    val = list(dm.val_dataloader())
    assert [b["image_ids"].tolist() for b in val] == [[104], [105]]
    assert all(b["images"].shape == (1, 3, 16, 16) and "captions" not in b for b in val)
    assert [b["image_ids"].tolist() for b in dm.test_dataloader()] == [[106]]


def test_given_vocabulary_is_kept(tiny_karpathy):
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + ["a", "red"])
    dm = CaptionDataModule(str(tiny_karpathy), image_size=8)
    dm.set_vocab(vocab.to_dict())
    dm.setup("test")
    assert dm.vocab == vocab
    ids = [t for b in dm.train_dataloader() for t in b["captions"].flatten().tolist()]
    assert max(ids) == vocab.stoi["red"]


def test_bad_image_raises_by_default(tiny_karpathy):
    bad = tiny_karpathy.parent / "images" / "1.jpg"
    bad.write_text("<html>not found</html>")
    dm = tiny_dm(tiny_karpathy, batch_size=8)
    with pytest.raises(ImageError, match=r"1\.jpg: not an image file"):
        next(iter(dm.train_dataloader()))


def test_bad_image_raised_in_one_line_from_worker(tiny_karpathy):
    (tiny_karpathy.parent / "images" / "4.png").write_bytes(b"")
    dm = tiny_dm(tiny_karpathy, num_workers=1)
    loader = dm.val_dataloader()
    assert loader.persistent_workers
    batch = next(iter(loader))
    assert batch["image_ids"].tolist() == [105] and "4.png: empty file" in batch["bad_images"][0]
    with pytest.raises(ImageError) as info:
        dm.on_before_batch_transfer(batch, 0)
    assert "\n" not in str(info.value) and str(info.value).endswith("4.png: empty file (0 bytes)")


def test_skip_drops_bad_samples_and_counts_them(tiny_karpathy):
    (tiny_karpathy.parent / "images" / "1.jpg").unlink()
    dm = tiny_dm(tiny_karpathy, batch_size=8, on_bad_image="skip")
    batch = next(iter(dm.train_dataloader()))
    assert batch["images"].shape[0] == batch["captions"].shape[0] == 5 and 101 not in batch["image_ids"].tolist()
    assert len(batch["bad_images"]) == 3 and "1.jpg: no such file" in batch["bad_images"][0]
    batch = dm.on_before_batch_transfer(batch, 0)
    assert "bad_images" not in batch and dm.skipped_samples == 3


def test_batch_of_only_bad_images_is_empty():
    collate = Collate(0, "images", (3, 4, 4), on_bad_image="skip", captions=True)
    batch = collate([{"error": "a.jpg: no such file"}, {"error": "b.jpg: empty file (0 bytes)"}])
    assert batch["images"].shape == (0, 3, 4, 4) and batch["captions"].shape == (0, 2)
    assert batch["lengths"].shape == batch["image_ids"].shape == (0,) and len(batch["bad_images"]) == 2


def test_skip_inside_a_lightning_fit(tiny_karpathy):
    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.batches = 0

        def training_step(self, batch, batch_idx):
            assert "bad_images" not in batch
            self.batches += 1
            return (self.w - batch["images"].mean()) ** 2 + 0 * batch["captions"].sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    (tiny_karpathy.parent / "images" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    dm = CaptionDataModule(str(tiny_karpathy), batch_size=2, image_size=8, min_word_freq=1, on_bad_image="skip")
    model = Tiny()
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=dm)
    assert model.batches == 4 and dm.skipped_samples == 1


def test_config_errors(tiny_karpathy):
    with pytest.raises(ConfigError, match="no such feature cache folder"):
        CaptionDataModule(str(tiny_karpathy), features="feats.h5")
    with pytest.raises(ConfigError, match="batch_size"):
        CaptionDataModule(str(tiny_karpathy), batch_size=0)
    with pytest.raises(ConfigError, match="on_bad_image"):
        CaptionDataModule(str(tiny_karpathy), on_bad_image="ignore")
    with pytest.raises(AnnotationError, match="no such file"):
        CaptionDataModule(str(tiny_karpathy.parent / "missing.json")).setup("fit")


def test_empty_split_is_an_annotation_error(tmp_path):
    image = {"filename": "a.png", "imgid": 0, "split": "train", "sentences": [{"raw": "a dog"}]}
    (tmp_path / "ann.json").write_text(json.dumps({"images": [image]}))
    dm = tiny_dm(tmp_path / "ann.json", min_word_freq=1)
    with pytest.raises(AnnotationError, match=r"ann.json: no images in split 'val'"):
        dm.val_dataloader()


def test_a_prepared_vocabulary_file_is_used(tiny_karpathy, tmp_path):
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + ["zebra", "red"])
    vocab.save(tmp_path / "vocab.json")
    dm = CaptionDataModule(str(tiny_karpathy), image_size=8, vocabulary=str(tmp_path / "vocab.json"))
    dm.setup("fit")
    assert dm.vocab == vocab  # not the one the training captions would give
    built = CaptionDataModule(str(tiny_karpathy), image_size=8, min_word_freq=1)
    built.setup("fit")
    assert built.vocab != vocab


def test_cached_images_are_the_files_images_read_once(tiny_karpathy, monkeypatch):
    """cache_images: every batch equals the uncached one, and each image file is decoded once."""
    import captioning.data.datasets as datasets

    plain = tiny_dm(tiny_karpathy, batch_size=8)
    cached = tiny_dm(tiny_karpathy, batch_size=8, cache_images=True)
    reads = []
    real_load = datasets.load_image
    monkeypatch.setattr(datasets, "load_image", lambda path: reads.append(path) or real_load(path))
    train = cached.train_dataloader()
    for _ in range(3):
        for a, b in zip(plain.train_dataloader(), train):
            assert torch.equal(a["images"], b["images"]) and torch.equal(a["captions"], b["captions"])
    pairs = len(train.dataset)  # 8 training captions of 4 images (train + restval)
    assert pairs == 8 and len(set(reads)) == 4
    assert (
        len(reads) == 3 * pairs + 4
    )  # the uncached loader read an image per caption and epoch, the cached one each image once
    val = cached.val_dataloader()
    first, again = next(iter(val)), next(iter(val))
    assert torch.equal(first["images"], again["images"]) and torch.equal(
        first["images"], next(iter(plain.val_dataloader()))["images"]
    )


def test_unreadable_images_are_not_cached(tiny_karpathy):
    (tiny_karpathy.parent / "images" / "1.jpg").unlink()
    dm = tiny_dm(tiny_karpathy, batch_size=8, on_bad_image="skip", cache_images=True)
    for _ in range(2):  # reported again in every epoch, as without the cache
        batch = next(iter(dm.train_dataloader()))
        assert len(batch["bad_images"]) == 3 and 101 not in batch["image_ids"].tolist()
