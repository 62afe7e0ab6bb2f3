"""The datasets and the collate function behind every loader.

Training yields one sample per (image, caption) pair (or per image with all its captions),
evaluation one sample per image. Images are read lazily by :meth:`ImageDataset.visual` (the one
place that swaps in a feature cache, or keeps the decoded images in memory with
``cache_images``). An unreadable image gives a sample ``{"error": message}`` that :class:`Collate`
drops from its batch and reports.

The datasets hold their records as arrays (data/records.py: :class:`ImageRefs`,
:class:`CaptionTable`), not as the records themselves: a loader worker reads them without copying
the parent's Python objects.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, default_collate, get_worker_info

from captioning.data.features.reader import FeatureCache
from captioning.data.images import (
    DEFAULT_INTERPOLATION,
    check_interpolation,
    jpeg_file_bytes,
    load_image,
    pack_jpegs,
    pixels_to_float,
    to_pixels,
)
from captioning.data.records import CaptionTable, ImageRecord, ImageRef, ImageRefs
from captioning.errors import ImageError
from captioning.vocab import Vocabulary


class ImageDataset(Dataset):
    """One sample per image: ``{"images": (3, S, S), "image_ids": int}``, or ``{"error": message}``.

    With a feature cache the sample is ``{"features": (L, D) float16, "image_ids": int}``.
    With ``cache_images`` each image is decoded and resized once and kept in memory, as uint8
    (3 x S x S bytes an image; the same tensor as a fresh read): for data small enough to hold, where
    decoding would otherwise be repeated every epoch (each loader worker keeps its own copy).
    Images are resized with ``interpolation`` (data/images.py: INTERPOLATIONS), the model's.
    With ``encoded`` (``data.decode_device`` cuda) a JPEG file's sample is its bytes, (N,) uint8, and
    its ``path``: the main process decodes it on the GPU (data/images.py: decode_batch).
    """

    encoded = False

    def __init__(
        self,
        records: Sequence[ImageRecord],
        images_root: str,
        image_size: int,
        features: FeatureCache | None = None,
        cache_images: bool = False,
        interpolation: str = DEFAULT_INTERPOLATION,
    ):
        self.refs = ImageRefs(records)  # the records' image ids and paths, as arrays
        self.images_root, self.image_size = images_root, image_size
        self.interpolation = check_interpolation(interpolation)
        self.features = features
        self.pixels: dict[int, np.ndarray] | None = {} if cache_images and features is None else None
        self.visual_key = "features" if features is not None else "images"  # the batch key of the visual input
        # of one sample's visual input
        self.visual_shape = tuple(features.grid_shape) if features is not None else (3, image_size, image_size)

    def __len__(self) -> int:
        return len(self.refs)

    def visual(self, record: ImageRef) -> Tensor:
        """The visual input of a sample: its cached grid (L, D), or its image file resized to (3, S, S)."""
        if self.features is not None:
            return self.features[record.image_id]
        if self.encoded:  # a JPEG the GPU decodes: its bytes; anything else is decoded here
            jpeg = jpeg_file_bytes(os.path.join(self.images_root, record.path))
            if jpeg is not None:
                return jpeg
        if self.pixels is None:
            return torch.from_numpy(pixels_to_float(self._read(record)))
        pixels = self.pixels.get(record.image_id)
        if pixels is None:
            pixels = self.pixels[record.image_id] = self._read(record)
        return torch.from_numpy(pixels_to_float(pixels))

    def _read(self, record: ImageRef) -> np.ndarray:
        """The record's image file as uint8 (3, S, S)."""
        return to_pixels(load_image(os.path.join(self.images_root, record.path)), self.image_size, self.interpolation)

    def _sample(self, record: ImageRef) -> dict:
        try:
            sample = {self.visual_key: self.visual(record), "image_ids": record.image_id}
            if self.encoded:
                sample["path"] = os.path.join(self.images_root, record.path)
            return sample
        except ImageError as err:  # reported by the collate function, in the main process
            return {"error": str(err)}

    def __getitem__(self, i: int) -> dict:
        return self._sample(self.refs[i])


class CaptionPairDataset(ImageDataset):
    """One sample per (image, caption) pair; adds ``"captions"``: (T,) long ids [BOS w.. EOS]."""

    def __init__(
        self,
        records: Sequence[ImageRecord],
        images_root: str,
        image_size: int,
        vocab: Vocabulary,
        max_length: int | None,
        features: FeatureCache | None = None,
        cache_images: bool = False,
        interpolation: str = DEFAULT_INTERPOLATION,
        table: CaptionTable | None = None,
    ):
        super().__init__(records, images_root, image_size, features, cache_images, interpolation)
        self.vocab, self.max_length = vocab, max_length
        table = table if table is not None else CaptionTable.of(records)
        # every pair's caption as vocabulary ids, and the record of each pair (pair i is caption i)
        self.ids, self.starts = table.encode(vocab.stoi, vocab.unk_id), table.starts
        self.record_index = table.record_of_caption()
        self._lengths = table.lengths()

    def caption_lengths(self) -> np.ndarray:
        """Words of each pair's caption (as encoded: at most max_length), for length bucketing."""
        return np.minimum(self._lengths, self.max_length) if self.max_length else self._lengths

    def __len__(self) -> int:
        return len(self.record_index)

    def __getitem__(self, i: int) -> dict:
        sample = self._sample(self.refs[int(self.record_index[i])])
        if "error" not in sample:
            sample["captions"] = encoded_caption(self.ids, self.starts, i, self.max_length)
        return sample


class CaptionGroupDataset(ImageDataset):
    """One sample per image with ALL its captions: ``"captions"`` is a list of (T_j,) id tensors.

    Batches of these encode each image once for its captions (the collate function adds
    ``"image_index"``, the image row of every caption), instead of once per caption.
    """

    def __init__(
        self,
        records: Sequence[ImageRecord],
        images_root: str,
        image_size: int,
        vocab: Vocabulary,
        max_length: int | None,
        features: FeatureCache | None = None,
        cache_images: bool = False,
        interpolation: str = DEFAULT_INTERPOLATION,
        table: CaptionTable | None = None,
    ):
        super().__init__(records, images_root, image_size, features, cache_images, interpolation)
        self.vocab, self.max_length = vocab, max_length
        table = table if table is not None else CaptionTable.of(records)
        self.ids, self.starts = table.encode(vocab.stoi, vocab.unk_id), table.starts
        self.first_caption = table.first_caption

    def __getitem__(self, i: int) -> dict:
        sample = self._sample(self.refs[i])
        if "error" not in sample:
            sample["captions"] = [
                encoded_caption(self.ids, self.starts, c, self.max_length)
                for c in range(int(self.first_caption[i]), int(self.first_caption[i + 1]))
            ]
        return sample


def encoded_caption(ids: np.ndarray, starts: np.ndarray, c: int, max_length: int | None) -> Tensor:
    """Caption ``c`` of a :class:`CaptionTable` encoded as ``Vocabulary.encode`` does: (T,) long,
    ``[BOS] + its first max_length ids + [EOS]``. ``ids``: the table's tokens as vocabulary ids."""
    start, end = int(starts[c]), int(starts[c + 1])
    if max_length is not None:
        end = min(end, start + max_length)
    out = torch.empty(end - start + 2, dtype=torch.long)
    out[0], out[-1] = Vocabulary.bos_id, Vocabulary.eos_id
    out[1:-1] = torch.from_numpy(ids[start:end])
    return out


class Collate:
    """Stack samples into a batch, padding captions to the longest; unreadable samples are dropped.

    ``visual_key`` and ``visual_shape`` name and shape one sample's visual input (see ImageDataset).
    """

    def __init__(
        self, pad_id: int, visual_key: str, visual_shape: tuple, on_bad_image: str = "error", captions: bool = False
    ):
        self.pad_id, self.visual_key, self.visual_shape = pad_id, visual_key, tuple(visual_shape)
        self.on_bad_image, self.captions = on_bad_image, captions

    def __call__(self, samples: list[dict]) -> dict:
        bad = [s["error"] for s in samples if "error" in s]
        if bad and self.on_bad_image == "error" and get_worker_info() is None:
            raise ImageError(bad[0])  # in a worker, on_before_batch_transfer raises it instead
        good = [s for s in samples if "error" not in s]
        visual = [s[self.visual_key] for s in good]
        if any(v.dim() == 1 for v in visual):  # JPEG bytes, decoded on the GPU (data/images.py: decode_batch)
            batch = pack_jpegs(visual, [s.get("path", "") for s in good])
        else:
            batch = {self.visual_key: default_collate(visual) if good else torch.zeros(0, *self.visual_shape)}
        batch["image_ids"] = torch.tensor([s["image_ids"] for s in good], dtype=torch.long)  # (B,)
        if self.captions:
            grouped = bool(good) and isinstance(good[0]["captions"], list)
            if grouped:  # every caption of every image; image_index maps caption rows to image rows
                seqs = [c for s in good for c in s["captions"]]
                batch["image_index"] = torch.tensor(
                    [i for i, s in enumerate(good) for _ in s["captions"]], dtype=torch.long
                )
            else:
                seqs = [s["captions"] for s in good]
            lengths = torch.tensor([len(c) for c in seqs], dtype=torch.long)  # (N,) incl. BOS, EOS
            captions = torch.full((len(seqs), max(lengths.tolist(), default=2)), self.pad_id, dtype=torch.long)
            for row, c in enumerate(seqs):
                captions[row, : len(c)] = c  # (N, T), PAD after EOS
            batch.update(captions=captions, lengths=lengths)
        batch["bad_images"] = bad
        return batch
