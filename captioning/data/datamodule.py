"""The LightningDataModule: annotation file -> vocabulary, datasets and loaders.

The annotation file may be a Karpathy split JSON, raw COCO caption JSON (with an optional Karpathy
split file) or a captions CSV / JSON-lines file next to a folder of images (see formats.py).

Training yields one sample per (image, caption) pair, evaluation one sample per image. Images are
read lazily by the datasets' ``visual`` method (the one place to swap for a feature cache);
``setup`` only reads the annotation file, never the images.

Batches (B samples, S = image_size, T = longest caption in the batch incl. BOS and EOS):
    train:      {"images": (B, 3, S, S) float, "captions": (B, T) long [BOS w.. EOS PAD..],
                 "lengths": (B,) long, "image_ids": (B,) long, "bad_images": list[str]}
    val / test: {"images": (B, 3, S, S) float, "image_ids": (B,) long, "bad_images": list[str]}
With ``features`` (a cache written by ``captioning extract-features``) the visual input is
``"features": (B, L, D) float16`` instead of ``"images"``.
"bad_images" holds the messages of unreadable images dropped from the batch (``on_bad_image="skip"``);
``on_before_batch_transfer`` removes it, counts them in ``skipped_samples`` and logs each file once.
With ``on_bad_image="error"`` the first one is raised as an :class:`ImageError` (one line, also when
it happened in a worker process). A batch whose images are all unreadable has B = 0.
"""
from __future__ import annotations

import logging
import os
from typing import Literal, Optional, Sequence, Union

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, get_worker_info

from captioning.data.features import FeatureCache
from captioning.data.formats import load_records
from captioning.data.sampling import ResumableLoader
from captioning.data.images import load_image, to_tensor
from captioning.data.karpathy import ImageRecord, split_records
from captioning.errors import AnnotationError, ConfigError, ImageError
from captioning.vocab import Vocabulary

log = logging.getLogger(__name__)


class ImageDataset(Dataset):
    """One sample per image: ``{"images": (3, S, S), "image_ids": int}``, or ``{"error": message}``.

    With a feature cache the sample is ``{"features": (L, D) float16, "image_ids": int}``.
    """

    def __init__(self, records: Sequence[ImageRecord], images_root: str, image_size: int,
                 features: Optional[FeatureCache] = None):
        self.records, self.images_root, self.image_size = list(records), images_root, image_size
        self.features = features
        self.visual_key = "features" if features is not None else "images"  # the batch key of the visual input
        # of one sample's visual input
        self.visual_shape = tuple(features.grid_shape) if features is not None else (3, image_size, image_size)

    def __len__(self) -> int:
        return len(self.records)

    def visual(self, record: ImageRecord) -> Tensor:
        """The visual input of a sample: its cached grid (L, D), or its image file resized to (3, S, S)."""
        if self.features is not None:
            return self.features[record.image_id]
        return to_tensor(load_image(os.path.join(self.images_root, record.path)), self.image_size)

    def _sample(self, record: ImageRecord) -> dict:
        try:
            return {self.visual_key: self.visual(record), "image_ids": record.image_id}
        except ImageError as err:  # reported by the collate function, in the main process
            return {"error": str(err)}

    def __getitem__(self, i: int) -> dict:
        return self._sample(self.records[i])


class CaptionPairDataset(ImageDataset):
    """One sample per (image, caption) pair; adds ``"captions"``: (T,) long ids [BOS w.. EOS]."""

    def __init__(self, records: Sequence[ImageRecord], images_root: str, image_size: int,
                 vocab: Vocabulary, max_length: Optional[int], features: Optional[FeatureCache] = None):
        super().__init__(records, images_root, image_size, features)
        self.vocab, self.max_length = vocab, max_length
        counts = [len(r.tokens) for r in self.records]
        # (record index, caption index) of every pair, as arrays: cheap to share with workers
        self.record_index = np.repeat(np.arange(len(counts)), counts)
        self.caption_index = np.concatenate([np.arange(n) for n in counts]) if counts else np.zeros(0, int)

    def caption_lengths(self) -> np.ndarray:
        """Words of each pair's caption (as encoded: at most max_length), for length bucketing."""
        cap = self.max_length or np.iinfo(np.int64).max
        return np.array([min(len(self.records[r].tokens[c]), cap) for r, c in zip(self.record_index, self.caption_index)],
                        dtype=np.int64)

    def __len__(self) -> int:
        return len(self.record_index)

    def __getitem__(self, i: int) -> dict:
        record = self.records[self.record_index[i]]
        sample = self._sample(record)
        if "error" not in sample:
            tokens = record.tokens[self.caption_index[i]]
            sample["captions"] = torch.tensor(self.vocab.encode(tokens, self.max_length), dtype=torch.long)
        return sample


class CaptionGroupDataset(ImageDataset):
    """One sample per image with ALL its captions: ``"captions"`` is a list of (T_j,) id tensors.

    Batches of these encode each image once for its captions (the collate function adds
    ``"image_index"``, the image row of every caption), instead of once per caption.
    """

    def __init__(self, records: Sequence[ImageRecord], images_root: str, image_size: int,
                 vocab: Vocabulary, max_length: Optional[int], features: Optional[FeatureCache] = None):
        super().__init__(records, images_root, image_size, features)
        self.vocab, self.max_length = vocab, max_length

    def __getitem__(self, i: int) -> dict:
        record = self.records[i]
        sample = self._sample(record)
        if "error" not in sample:
            sample["captions"] = [torch.tensor(self.vocab.encode(t, self.max_length), dtype=torch.long) for t in record.tokens]
        return sample


class Collate:
    """Stack samples into a batch, padding captions to the longest; unreadable samples are dropped.

    ``visual_key`` and ``visual_shape`` name and shape one sample's visual input (see ImageDataset).
    """

    def __init__(self, pad_id: int, visual_key: str, visual_shape: tuple, on_bad_image: str = "error",
                 captions: bool = False):
        self.pad_id, self.visual_key, self.visual_shape = pad_id, visual_key, tuple(visual_shape)
        self.on_bad_image, self.captions = on_bad_image, captions

    def __call__(self, samples: list[dict]) -> dict:
        bad = [s["error"] for s in samples if "error" in s]
        if bad and self.on_bad_image == "error" and get_worker_info() is None:
            raise ImageError(bad[0])  # in a worker, on_before_batch_transfer raises it instead
        good = [s for s in samples if "error" not in s]
        visual = [s[self.visual_key] for s in good]
        batch = {
            self.visual_key: torch.stack(visual) if good else torch.zeros(0, *self.visual_shape),  # (B, 3, S, S)
            "image_ids": torch.tensor([s["image_ids"] for s in good], dtype=torch.long),  # (B,)
        }
        if self.captions:
            grouped = bool(good) and isinstance(good[0]["captions"], list)
            if grouped:  # every caption of every image; image_index maps caption rows to image rows
                seqs = [c for s in good for c in s["captions"]]
                batch["image_index"] = torch.tensor([i for i, s in enumerate(good) for _ in s["captions"]], dtype=torch.long)
            else:
                seqs = [s["captions"] for s in good]
            lengths = torch.tensor([len(c) for c in seqs], dtype=torch.long)  # (N,) incl. BOS, EOS
            captions = torch.full((len(seqs), max(lengths.tolist(), default=2)), self.pad_id, dtype=torch.long)
            for row, c in enumerate(seqs):
                captions[row, : len(c)] = c  # (N, T), PAD after EOS
            batch.update(captions=captions, lengths=lengths)
        batch["bad_images"] = bad
        return batch


class CaptionDataModule(L.LightningDataModule):
    """Annotation file -> loaders of images (or cached features) and captions.

    Args:
        annotations: a Karpathy split JSON, COCO caption JSON (or a list of them), or a captions
            CSV / JSON-lines file; the format is told from the file (data/formats.py).
        split_file: for COCO caption files, a Karpathy split file (dataset_coco.json) assigning splits by cocoid.
        images_root: folder the records' paths are relative to (default: the annotation file's folder).
        batch_size: training batch size (caption pairs); eval_batch_size: val/test batch size (images),
            default batch_size.
        num_workers: loader worker processes (persistent when > 0). pin_memory: pin batches for the GPU.
        image_size: images are resized to S x S. max_length: captions are cut to this many words.
        min_word_freq: words seen fewer times in the training captions become <unk>.
        max_vocab_size: keep at most this many words (besides the special tokens).
        merge_restval: train on the "restval" images too.
        features: a feature cache folder (``captioning extract-features``) to read instead of images;
            the model's encoder must be the one that wrote it (its grid (L, D) is checked).
        on_bad_image: "error" raises on an unreadable image; "skip" drops it from its batch.
        group_captions: train on images with all their captions at once (batch_size then counts
            images): each image is encoded once per epoch instead of once per caption. Every
            (image, caption) pair is still trained on once per epoch.
        bucket_by_length: batch training captions of similar length together (as the authors'
            code does), so that fewer padded steps are computed; caption pairs only (not with
            group_captions). Batches are still drawn at random, and resume exactly.
    """

    def __init__(
        self,
        annotations: Union[str, list[str]],
        images_root: Optional[str] = None,
        batch_size: int = 32,
        num_workers: int = 0,
        image_size: int = 224,
        min_word_freq: int = 5,
        max_length: int = 30,
        merge_restval: bool = True,
        features: Optional[str] = None,
        eval_batch_size: Optional[int] = None,
        pin_memory: bool = False,
        max_vocab_size: Optional[int] = None,
        on_bad_image: Literal["error", "skip"] = "error",
        group_captions: bool = False,
        split_file: Optional[str] = None,
        bucket_by_length: bool = False,
    ):
        super().__init__()
        for name, value, least in (("batch_size", batch_size, 1), ("num_workers", num_workers, 0),
                                   ("image_size", image_size, 1), ("min_word_freq", min_word_freq, 1),
                                   ("max_length", max_length, 1), ("eval_batch_size", eval_batch_size, 1),
                                   ("max_vocab_size", max_vocab_size, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ConfigError(f"data.{name}: expected an integer >= {least}, got {value!r}")
        if bucket_by_length and group_captions:
            raise ConfigError("data.bucket_by_length works on caption pairs: set data.group_captions false to use it")
        if on_bad_image not in ("error", "skip"):
            raise ConfigError(f"data.on_bad_image: expected 'error' or 'skip', got {on_bad_image!r}")
        if isinstance(annotations, (list, tuple)):
            self.annotations = [os.fspath(a) for a in annotations]
            first = self.annotations[0] if self.annotations else ""
        else:
            self.annotations = first = os.fspath(annotations)
        if features is not None and not os.path.isdir(features):
            raise ConfigError(f"data.features={features!r}: no such feature cache folder (write one with `captioning extract-features`)")
        self.split_file = split_file
        self.features = features
        self._feature_cache: Optional[FeatureCache] = None
        self.images_root = images_root or os.path.dirname(os.path.abspath(first))
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.image_size, self.max_length = image_size, max_length
        self.min_word_freq, self.max_vocab_size = min_word_freq, max_vocab_size
        self.merge_restval, self.on_bad_image = merge_restval, on_bad_image
        self.group_captions, self.bucket_by_length = group_captions, bucket_by_length
        self.vocab: Optional[Vocabulary] = None
        self.skipped_samples = 0  # samples dropped for unreadable images (on_bad_image="skip")
        self._bad_files: set[str] = set()
        self._records: Optional[list[ImageRecord]] = None

    # ------------------------------------------------------------------ data
    def set_vocab(self, vocab: Union[Vocabulary, dict]) -> None:
        """Use this vocabulary (e.g. a checkpoint's) instead of building one from the training captions."""
        self.vocab = vocab if isinstance(vocab, Vocabulary) else Vocabulary.from_dict(vocab)

    def setup(self, stage: Optional[str] = None) -> None:
        """Read the annotation file (once) and build the vocabulary from train tokens unless one was set."""
        if self._records is None:
            self._records = load_records(self.annotations, self.split_file, merge_restval=self.merge_restval)
        if self.vocab is None:
            train = self.records("train")
            self.vocab = Vocabulary.build((t for r in train for t in r.tokens), self.min_word_freq, self.max_vocab_size)

    def records(self, split: str) -> list[ImageRecord]:
        """The images of a split; an :class:`AnnotationError` if it has none."""
        if self._records is None:
            self._records = load_records(self.annotations, self.split_file, merge_restval=self.merge_restval)
        records = split_records(self._records, split)
        if not records:
            raise AnnotationError(f"{self.annotations}: no images in split {split!r}")
        return records

    def references(self, split: str) -> dict[int, list[str]]:
        """image_id -> raw reference captions of every image in the split."""
        return {r.image_id: list(r.captions) for r in self.records(split)}

    def feature_cache(self) -> Optional[FeatureCache]:
        """The feature cache (opened once; its memmaps open lazily in each process), or None."""
        if self.features is not None and self._feature_cache is None:
            self._feature_cache = FeatureCache(self.features)
        return self._feature_cache

    def _dataset(self, kind, split: str, **kwargs) -> ImageDataset:
        records, cache = self.records(split), self.feature_cache()
        if cache is not None:
            missing = cache.missing(r.image_id for r in records)
            if missing:
                raise ConfigError(
                    f"{self.features}: no complete features for {len(missing)} of the {len(records)} {split} images "
                    f"(e.g. image_id {missing[:3]}); run or resume `captioning extract-features` for them"
                )
        return kind(records, self.images_root, self.image_size, features=cache, **kwargs)

    # ------------------------------------------------------------------ loaders
    def _loader(self, dataset: ImageDataset, batch_size: int, train: bool) -> DataLoader:
        """Training loaders shuffle and carry captions; evaluation loaders keep the file order."""
        collate = Collate(Vocabulary.pad_id, dataset.visual_key, dataset.visual_shape, self.on_bad_image, captions=train)
        kwargs = dict(num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                      pin_memory=self.pin_memory, collate_fn=collate)
        if train:  # shuffled (or bucketed) per epoch from the run's seed, split over DDP ranks; resumable mid-epoch
            trainer = self.trainer
            world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
            lengths = dataset.caption_lengths() if self.bucket_by_length else None
            return ResumableLoader(dataset, batch_size, seed=torch.initial_seed() % 2**31, lengths=lengths,
                                   num_replicas=world, rank=rank, **kwargs)
        # Evaluation: under DDP Lightning puts in its DistributedSampler.
        return DataLoader(dataset, batch_size=batch_size, shuffle=False, **kwargs)

    def train_dataloader(self) -> DataLoader:
        if self.vocab is None:
            self.setup("fit")
        kind = CaptionGroupDataset if self.group_captions else CaptionPairDataset
        dataset = self._dataset(kind, "train", vocab=self.vocab, max_length=self.max_length)
        return self._loader(dataset, self.batch_size, train=True)

    def eval_dataloader(self, split: str) -> DataLoader:
        """One batch entry per image of ``split``, in file order (also for splits other than val/test)."""
        return self._eval_loader(split)

    def _eval_loader(self, split: str) -> DataLoader:
        return self._loader(self._dataset(ImageDataset, split), self.eval_batch_size, train=False)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def on_before_batch_transfer(self, batch: dict, dataloader_idx: int) -> dict:
        """Raise or count the unreadable images a batch dropped (runs in the main process)."""
        bad = batch.pop("bad_images", None) if isinstance(batch, dict) else None
        if bad:
            if self.on_bad_image == "error":
                raise ImageError(bad[0])
            self.skipped_samples += len(bad)
            for message in bad:
                if message not in self._bad_files:
                    self._bad_files.add(message)
                    log.warning("skipped unreadable image: %s", message)
        return batch
