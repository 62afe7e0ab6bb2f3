"""Caption data: annotation file -> vocabulary, datasets and loaders (no Lightning here: evaluation
and tools use :class:`CaptionData` itself; training uses its LightningDataModule,
data/datamodule.py's :class:`CaptionDataModule`).

The annotation file may be of any registered format (data/formats/). The :class:`Annotations` its
format reads say where the images come from: image files, or the shards (training streams them,
evaluation reads the val/test images from them). The captions are split into tokens by
``tokenizer`` (captioning/tokenizers.py), which the vocabulary records. Training yields one sample
per (image, caption) pair, evaluation one sample per image (the datasets and the collate function
are in datasets.py); ``setup`` only reads the annotation file, never the images.

Batches (B samples, S = image_size, T = longest caption in the batch incl. BOS and EOS):
    train:      {"images": (B, 3, S, S) float, "captions": (B, T) long [BOS w.. EOS PAD..],
                 "lengths": (B,) long, "image_ids": (B,) long, "bad_images": list[str]}
    val / test: {"images": (B, 3, S, S) float, "image_ids": (B,) long, "bad_images": list[str]}
With ``features`` (a cache written by ``captioning extract-features``) the visual input is
``"features": (B, L, D) float16`` instead of ``"images"``. "bad_images" holds the messages of unreadable
images dropped from the batch; :meth:`CaptionData.drop_bad_images` removes it. The formats, and what
``on_bad_image`` does: docs/TRAINING.md, "Data".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioning.data.datasets import CaptionGroupDataset, CaptionPairDataset, Collate, ImageDataset
from captioning.data.features.reader import FeatureCache
from captioning.data.formats import default_images_root, read_annotations
from captioning.data.formats.base import Annotations
from captioning.data.images import check_decode_device, check_interpolation
from captioning.data.records import CaptionTable, ImageRecord, split_records
from captioning.data.sampling import ResumableLoader, SharingLoader
from captioning.data.tokens import fit_tokenizer, train_tokenizer
from captioning.errors import AnnotationError, ConfigError, ImageError
from captioning.tokenizers import DEFAULT_TOKENIZER, Tokenizer, build_tokenizer
from captioning.vocab import Vocabulary

log = logging.getLogger(__name__)


class CaptionData:
    """Annotation file -> loaders of images (or cached features) and captions.

    Args:
        annotations: a Karpathy split JSON, COCO caption JSON (or a list of them), a captions
            CSV / JSON-lines file, a Hub dataset or WebDataset shards; the format is told from the
            path (data/formats/__init__.py).
        split_file: for COCO caption files, a Karpathy split file (dataset_coco.json) assigning splits by cocoid.
        images_root: folder the records' paths are relative to (default: the annotation file's folder).
        batch_size: training batch size (caption pairs); eval_batch_size: val/test batch size (images),
            default batch_size.
        num_workers: loader worker processes (persistent when > 0). pin_memory: pin batches for the GPU.
        image_size: images are resized to S x S. max_length: captions are cut to this many words.
        interpolation: the resize's filter (data/images.py: INTERPOLATIONS), the model's: the
            training CLI links it from the encoder as it links image_size; bilinear by default.
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
        vocabulary: a vocabulary JSON (``captioning prepare --out FILE``) to use instead of
            building one from the training captions (e.g. to share one across runs).
        shuffle_buffer: with WebDataset shards, the (image, caption) pairs each loader worker mixes
            its stream through (data/formats/webdataset.py).
        cache_images: keep each decoded, resized image in memory (uint8, 3 x S x S bytes) after its
            first read instead of decoding it again every epoch, for data that fits in memory; each
            loader worker holds its own copy.
        decode_device: where JPEG files are decoded and resized: ``cpu`` (Pillow, in the loader's
            workers; the default) or ``cuda`` (``cuda:N``): the workers read the files' bytes and the
            GPU decodes each batch (nvJPEG) and resizes it, for when the CPU cores cannot keep the GPU
            fed (data/images.py; docs/PERFORMANCE.md). Image files only (not a feature cache, shards
            or ``cache_images``); bilinear or bicubic resizes.
        tokenizer: how captions are split into tokens (a name registered in captioning/tokenizers.py;
            the vocabulary built records it). Default: the tokenizer of the vocabulary given
            (``vocabulary``, a checkpoint's), else ``words``; one named here must be that of a
            vocabulary given. Where none is named (nor given) and the training captions are mostly
            CJK, ``jieba`` (``chars`` without it) is picked, in one line (data/tokens.py).
        vocab_size: the size of a trained tokenizer's vocabulary (``bpe``, ``unigram``: required).
    """

    def __init__(
        self,
        annotations: str | list[str],
        images_root: str | None = None,
        batch_size: int = 32,
        num_workers: int = 0,
        image_size: int = 224,
        min_word_freq: int = 5,
        max_length: int = 30,
        merge_restval: bool = True,
        features: str | None = None,
        eval_batch_size: int | None = None,
        pin_memory: bool = False,
        max_vocab_size: int | None = None,
        on_bad_image: Literal["error", "skip"] = "error",
        group_captions: bool = False,
        split_file: str | None = None,
        bucket_by_length: bool = False,
        vocabulary: str | None = None,
        shuffle_buffer: int = 1000,
        cache_images: bool = False,
        interpolation: str = "bilinear",
        tokenizer: str | None = None,
        vocab_size: int | None = None,
        decode_device: str = "cpu",
    ):
        super().__init__()
        for name, value, least in (
            ("batch_size", batch_size, 1),
            ("num_workers", num_workers, 0),
            ("image_size", image_size, 1),
            ("min_word_freq", min_word_freq, 1),
            ("max_length", max_length, 1),
            ("eval_batch_size", eval_batch_size, 1),
            ("max_vocab_size", max_vocab_size, 0),
            ("shuffle_buffer", shuffle_buffer, 1),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise ConfigError(f"data.{name}: expected an integer >= {least}, got {value!r}")
        if bucket_by_length and group_captions:
            raise ConfigError("data.bucket_by_length works on caption pairs: set data.group_captions false to use it")
        if on_bad_image not in ("error", "skip"):
            raise ConfigError(f"data.on_bad_image: expected 'error' or 'skip', got {on_bad_image!r}")
        if isinstance(annotations, (list, tuple)):
            self.annotations = [os.fspath(a) for a in annotations]
        else:
            self.annotations = os.fspath(annotations)
        if features is not None and not os.path.isdir(features):
            raise ConfigError(
                f"data.features={features!r}: no such feature cache folder (write one with `captioning extract-features`)"
            )
        self.split_file = split_file
        self.features = features
        self._feature_cache: FeatureCache | None = None
        self.images_root = images_root or default_images_root(self.annotations)
        self.vocabulary = vocabulary
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.image_size, self.max_length = image_size, max_length
        self.interpolation = check_interpolation(interpolation)
        self.min_word_freq, self.max_vocab_size = min_word_freq, max_vocab_size
        self.merge_restval, self.on_bad_image = merge_restval, on_bad_image
        self.group_captions, self.bucket_by_length = group_captions, bucket_by_length
        self.cache_images = cache_images
        self.decode_device = check_decode_device(decode_device, "data.decode_device", self.interpolation)
        if self.decode_device is not None and (features is not None or cache_images):
            raise ConfigError(
                f"data.decode_device {decode_device}: decodes image files; this run reads "
                f"{'a feature cache (data.features)' if features is not None else 'images kept in memory (data.cache_images)'}"
            )
        self.shuffle_buffer = shuffle_buffer
        self.tokenizer = build_tokenizer(tokenizer or DEFAULT_TOKENIZER, "data.tokenizer", vocab_size=vocab_size)
        self._tokenizer_named = tokenizer is not None  # else a vocabulary given brings its own
        self.vocab: Vocabulary | None = None
        self.skipped_samples = 0  # samples dropped for unreadable images (on_bad_image="skip")
        self._bad_files: set[str] = set()
        self._annotations: Annotations | None = None  # the records and their images' source, read once
        self._table: tuple | None = None  # (annotations, train CaptionTable): the training captions as arrays

    # ------------------------------------------------------------------ data
    def set_vocab(self, vocab: Vocabulary | dict) -> None:
        """Use this vocabulary (e.g. a checkpoint's) instead of building one from the training captions."""
        vocab = vocab if isinstance(vocab, Vocabulary) else Vocabulary.from_dict(vocab)
        self._use_tokenizer_of(vocab, "the vocabulary given")
        self.vocab = vocab

    def _use_tokenizer_of(self, vocab: Vocabulary, source: str) -> None:
        """Split the captions as ``vocab``'s tokens were split (one line if data.tokenizer says otherwise)."""
        if vocab.tokenizer.name == self.tokenizer.name:
            own = vocab.tokenizer.state() is not None or vocab.tokenizer.version != self.tokenizer.version
            if own and vocab.tokenizer is not self.tokenizer:
                # a trained tokenizer: the vocabulary's own model; a versioned one: the version it recorded
                self.tokenizer = vocab.tokenizer
                self._annotations = None
            return
        if self._tokenizer_named:
            raise ConfigError(
                f"data.tokenizer: {self.tokenizer.name!r}, but {source} was built with the "
                f"{vocab.tokenizer.name!r} tokenizer; set data.tokenizer: {vocab.tokenizer.name} or leave it out"
            )
        self.tokenizer = vocab.tokenizer
        self._annotations = None  # read again, split by this tokenizer

    def setup(self, stage: str | None = None) -> None:
        """Read the annotation file (once) and build the vocabulary from train tokens unless one was set."""
        if self.vocab is None and self.vocabulary is not None:
            vocab = Vocabulary.load(self.vocabulary)
            self._use_tokenizer_of(vocab, self.vocabulary)
            self.vocab = vocab
        self.all_records()
        if self.vocab is None:  # counted from the training captions' table, which the training loader reads too
            self.vocab = Vocabulary.from_counts(
                self.caption_table().counts(), self.min_word_freq, self.max_vocab_size, tokenizer=self.tokenizer
            )

    def read_annotations(self) -> Annotations:
        """The annotation file's records and their images' source, read once. The readers split
        captions into words; another tokenizer splits the raw captions again."""
        if self._annotations is None:
            annotations = read_annotations(self.annotations, self.split_file, merge_restval=self.merge_restval)
            named = self._tokenizer_named or self.vocabulary is not None or self.vocab is not None
            self.tokenizer = fit_tokenizer(
                self.tokenizer, annotations.records, named, str(self.annotations), trainer=self.train_tokenizer
            )
            self._annotations = annotations
        return self._annotations

    def train_tokenizer(self, tokenizer: Tokenizer, texts: Iterable[str]) -> None:
        """Train a tokenizer that learns (bpe, unigram) on the training captions (here, in this
        process; a distributed run's datamodule trains it on rank 0 and shares it)."""
        train_tokenizer(tokenizer, texts)

    def all_records(self) -> list[ImageRecord]:
        """Every image of the annotation file, read once."""
        return self.read_annotations().records

    def caption_table(self) -> CaptionTable:
        """The training records' captions as token ids (data/records.py), made once in one pass:
        the vocabulary is counted from it and the training datasets read it."""
        annotations = self.read_annotations()
        if self._table is None or self._table[0] is not annotations:
            self._table = (annotations, CaptionTable.of(self.records("train")))
        return self._table[1]

    def decoding_length_problem(self, limits: dict[str, int], share: float = 0.01) -> str | None:
        """One line when more than ``share`` of the training captions, as the model learns them (at
        most ``max_length`` tokens, then EOS), are longer than a decoding length of ``limits`` (a
        setting's name -> its max_new_tokens) lets the model write: its captions would be cut
        mid-phrase. None when every length fits the data, or the data has no training split."""
        try:
            lengths = np.minimum(self.caption_table().lengths(), self.max_length) + 1  # + EOS
        except AnnotationError:
            return None
        if not len(lengths):
            return None
        short = {name: n for name, n in limits.items() if (lengths > n).mean() > share}
        if not short:
            return None
        longest, p95 = int(lengths.max()), int(np.percentile(lengths, 95))
        settings = " and ".join(f"{name} {n}" for name, n in short.items())
        cut = max((lengths > n).mean() for n in short.values())
        return (
            f"the training captions run to {longest} tokens with EOS (95% within {p95}), but {settings} "
            f"cut {cut:.0%} of them: the model's captions would stop mid-phrase; set "
            f"{' and '.join(f'{name} {longest}' for name in short)} (or more)"
        )

    def records(self, split: str) -> list[ImageRecord]:
        """The images of a split; an :class:`AnnotationError` if it has none."""
        records = split_records(self.all_records(), split)
        if not records:
            raise AnnotationError(f"{self.annotations}: no images in split {split!r}")
        return records

    def references(self, split: str) -> dict[int, list[str]]:
        """image_id -> raw reference captions of every image in the split."""
        return {r.image_id: list(r.captions) for r in self.records(split)}

    def dataset_scores(self, split: str, predictions: dict[int, str], alignments: dict | None = None) -> dict:
        """Scores that only this dataset can give (evaluation computes them as the registered metrics
        "objects" and "grounding": metrics/shapes_metrics.py).

        For data whose images list their objects (the shapes data): object F1 and, given the
        captions' ``alignments`` (words, alphas, locations), attention grounding. Otherwise none.
        """
        records = [r for r in self.records(split) if r.image_id in predictions]
        if not any(r.objects for r in records):
            return {}
        from captioning.data.shapes import shapes_scores

        return shapes_scores(records, predictions, alignments, self.images_root)

    def feature_cache(self) -> FeatureCache | None:
        """The feature cache (opened once; its memmaps open lazily in each process), or None."""
        if self.features is not None and self._feature_cache is None:
            self._feature_cache = FeatureCache(self.features)
            self._feature_cache.check(image_size=self.image_size, interpolation=self.interpolation)
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
        if kind is ImageDataset:  # evaluation: the images from wherever the format keeps them
            dataset = self.read_annotations().image_dataset(
                records,
                self.images_root,
                self.image_size,
                features=cache,
                cache_images=self.cache_images,
                interpolation=self.interpolation,
            )
            dataset.encoded = self.decode_device is not None and type(dataset) is ImageDataset  # image files
            return dataset
        dataset = kind(
            records,
            self.images_root,
            self.image_size,
            features=cache,
            cache_images=self.cache_images,
            interpolation=self.interpolation,
            **({"table": self.caption_table()} if split == "train" else {}),
            **kwargs,
        )
        dataset.encoded = self.decode_device is not None
        return dataset

    # ------------------------------------------------------------------ loaders
    def _loader(self, dataset: ImageDataset, batch_size: int, train: bool) -> DataLoader:
        """Training loaders shuffle and carry captions; evaluation loaders keep the file order."""
        collate = Collate(
            Vocabulary.pad_id, dataset.visual_key, dataset.visual_shape, self.on_bad_image, captions=train
        )
        kwargs = dict(
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
            collate_fn=collate,
        )
        if train:  # shuffled (or bucketed) per epoch from the run's seed, split over DDP ranks; resumable mid-epoch
            world, rank = self.replicas()
            lengths = dataset.caption_lengths() if self.bucket_by_length else None
            return ResumableLoader(
                dataset,
                batch_size,
                seed=torch.initial_seed() % 2**31,
                lengths=lengths,
                num_replicas=world,
                rank=rank,
                **kwargs,
            )
        # Evaluation: under DDP Lightning puts in its DistributedSampler.
        return SharingLoader(dataset, batch_size=batch_size, shuffle=False, **kwargs)

    def train_dataloader(self) -> DataLoader:
        if self.vocab is None:
            self.setup("fit")
        streamed = self.read_annotations().train_loader(self)  # e.g. WebDataset shards
        if streamed is not None and self.decode_device is not None:
            raise ConfigError(
                f"data.decode_device {self.decode_device}: decodes image files; WebDataset shards are decoded "
                "on the CPU (data.decode_device cpu)"
            )
        if streamed is not None:
            return streamed
        kind = CaptionGroupDataset if self.group_captions else CaptionPairDataset
        dataset = self._dataset(kind, "train", vocab=self.vocab, max_length=self.max_length)
        return self._loader(dataset, self.batch_size, train=True)

    def epoch_of(self):
        """A callable giving the epoch a streamed loader should read next, or None (the loader counts its passes)."""
        return None

    def eval_dataloader(self, split: str) -> DataLoader:
        """One batch entry per image of ``split``, in file order (also for splits other than val/test)."""
        return self._eval_loader(split)

    def image_dataset(self, records: Sequence[ImageRecord]) -> ImageDataset:
        """One sample per record, ``{"images": (3, S, S), "image_ids": int}``, read from the image
        files or the WebDataset shards alike and resized as the model's are; never from the feature
        cache (``captioning extract-features`` writes one with it)."""
        return self.read_annotations().image_dataset(
            records, self.images_root, self.image_size, interpolation=self.interpolation
        )

    def read_image(self, record: ImageRecord):
        """The record's image as stored (an RGB PIL image, not resized), from its file or its shard
        (what CLIP scores: the image itself, whatever the model was fed)."""
        return self.read_annotations().read_image(record, self.images_root)

    def image_bytes(self, record: ImageRecord) -> bytes:
        """The record's image file's bytes as stored, from its file or its shard."""
        return self.read_annotations().image_bytes(record, self.images_root)

    def _eval_loader(self, split: str) -> DataLoader:
        return self._loader(self._dataset(ImageDataset, split), self.eval_batch_size, train=False)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def replicas(self) -> tuple[int, int]:
        """(processes, this process's rank) the training loader splits the data over: one here."""
        return 1, 0

    def drop_bad_images(self, batch: dict) -> dict:
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
