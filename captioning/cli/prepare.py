"""``captioning prepare``: check a dataset before training and build its vocabulary.

Counts images and captions per split, tries to read every image (``load_image``) and lists ALL
missing or unreadable files, builds and saves the vocabulary from the training captions, and prints
the caption length distribution. Problems (an annotation error, unreadable images) make it exit 1.
With ``to_webdataset`` it then writes the dataset as WebDataset shards (data/formats/webdataset.py), unless
it has problems: data in any format the project reads is moved once.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

import numpy as np

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least, counted
from captioning.errors import CaptioningError


def length_report(lengths: Sequence[int], width: int = 40, out: TextIO | None = None) -> None:
    """min / mean / percentiles / max of caption lengths (words), and a text histogram."""
    out = out or sys.stdout
    if len(lengths) == 0:
        print("caption length (words): no captions", file=out)
        return
    a = np.asarray(lengths)
    p = np.percentile(a, [50, 90, 95, 99])
    print(
        f"caption length (words): min {a.min()}  mean {a.mean():.1f}  median {p[0]:.0f}  p90 {p[1]:.0f}  "
        f"p95 {p[2]:.0f}  p99 {p[3]:.0f}  max {a.max()}",
        file=out,
    )
    edges = list(range(0, 31, 5)) + [max(int(a.max()), 30) + 1]
    counts = [int(((a >= lo) & (a < hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:])]
    top = max(counts) or 1
    for (lo, hi), c in zip(zip(edges[:-1], edges[1:]), counts):
        label = f"{lo:>3}-{hi - 1:<3}" if lo < 30 else f"{lo:>3}+   "
        print(f"  {label} {'#' * round(width * c / top):<{width}} {c}", file=out)


#: above this share of the training words' occurrences turned <unk>, prepare names the words lost
LOST_SHARE = 0.05
#: the words a warning names (the most frequent lost ones)
LOST_SHOWN = 8


def lost_words_warning(words: Counter, vocab, min_word_freq: int) -> str | None:
    """One line naming the training words that become <unk> (the most frequent first, and their
    count) when they are more than :data:`LOST_SHARE` of the training words, with the flags that
    keep them; None otherwise. ``words``: each training word's count."""
    lost = sorted((w for w in words if w not in vocab), key=lambda w: (-words[w], w))
    share = sum(words[w] for w in lost) / max(sum(words.values()), 1)
    if share <= LOST_SHARE:
        return None
    shown = ", ".join(repr(w) for w in lost[:LOST_SHOWN]) + (", ..." if len(lost) > LOST_SHOWN else "")
    keep = min(words[w] for w in lost)  # the cut that keeps every one of them
    return (
        f"warning: {len(lost)} of {counted(len(words), 'distinct training word')} ({share:.0%} of the training "
        f"words) are seen fewer than {min_word_freq} times and become <unk>: {shown}; "
        f"on a small set keep them with --min-word-freq {keep} (and --data.min_word_freq {keep} when training)"
    )


def check_images(records, images_root: str, progress: bool = True, shards=None) -> list[str]:
    """Messages of every missing or unreadable image (each file tried once); ``shards``: the
    :class:`~captioning.data.formats.webdataset.ShardIndex` the records' images are read from."""
    from tqdm.auto import tqdm

    from captioning.data.formats.webdataset import decode_image
    from captioning.data.images import load_image

    problems = []
    for r in tqdm(records, desc="checking images", unit="img", disable=None if progress else True):
        try:
            if shards is not None:
                member = shards.members[r.imgid]
                decode_image(member.read(), f"{member.shard}: {member.name}")
            else:
                load_image(os.path.join(images_root, r.path))
        except CaptioningError as err:
            problems.append(str(err))
    return problems


def prepare(
    annotations,
    images_root: str | None = None,
    min_word_freq: int = 5,
    out: str | None = None,
    split_file: str | None = None,
    max_vocab_size: int | None = None,
    check: bool = True,
    progress: bool = True,
    to_webdataset: str | None = None,
    shard_size: int = 1000,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
) -> int:
    """Run the checks and print the report; returns the exit status (0 fine, 1 problems).
    ``to_webdataset``: a folder to write the dataset's shards to (``shard_size`` images each).
    ``tokenizer`` / ``vocab_size``: as ``data.tokenizer`` / ``data.vocab_size`` (captioning/tokenizers.py);
    none named picks one for mostly-CJK captions, as training does (data/tokens.py)."""
    from captioning.data.formats import default_images_root, detect_format, load_records
    from captioning.data.formats.webdataset import is_shards, read_index
    from captioning.data.tokens import fit_tokenizer
    from captioning.tokenizers import DEFAULT_TOKENIZER, build_tokenizer
    from captioning.vocab import Vocabulary

    first = annotations if isinstance(annotations, str) else annotations[0]
    splitter = build_tokenizer(
        tokenizer or DEFAULT_TOKENIZER, "--tokenizer", vocab_size=vocab_size, size_field="--vocab-size"
    )
    images_root = images_root or default_images_root(annotations)
    problems = []  # every problem of the file, each once (images or rows with one are left out)
    shards = None
    if is_shards(annotations):  # a file-level AnnotationError: exit 1
        shards = read_index(annotations, problems=problems)
        records = shards.records
    else:
        records = load_records(annotations, split_file, problems=problems)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if records:
        splitter = fit_tokenizer(splitter, records, tokenizer is not None, first)
    print(f"{first}: {detect_format(first)} format, {counted(len(records), 'image')}, images under {images_root}")
    per_split = Counter(r.split for r in records)
    caps = Counter()
    for r in records:
        caps[r.split] += len(r.captions)
    for split in sorted(per_split):
        print(f"  {split:<8} {counted(per_split[split], 'image'):>15} {counted(caps[split], 'caption'):>18}")
    if problems:
        problems = [f"{len(problems)} image(s) or row(s) of the annotation file have problems (listed above)"]
    if not records:
        problems.append("no usable images in the annotation file")
    elif "train" not in per_split:
        problems.append("no training images (split 'train')")
    for split in ("val", "test"):
        if split not in per_split:
            print(f"warning: no {split!r} images: fit's validation / test would fail", file=sys.stderr)
    if to_webdataset and not check:
        problems.append("--to-webdataset reads every image: leave out --no-image-check")
    if check:
        bad = check_images(records, images_root, progress, shards)
        for message in bad:
            print(f"unreadable: {message}", file=sys.stderr)
        if bad:
            hint = f"; is --images-root {images_root} right?" if len(bad) == len(records) else ""
            verb = "is" if len(bad) == 1 else "are"
            problems.append(
                f"{len(bad)} of {counted(len(records), 'image')} {verb} missing or unreadable (listed above){hint}"
            )
        else:
            print(f"all {counted(len(records), 'image')} readable" if len(records) > 1 else "the image is readable")
    train = [t for r in records if r.split == "train" for t in r.tokens]
    if train:
        vocab = Vocabulary.build(train, min_word_freq, max_vocab_size, tokenizer=splitter)
        words = Counter(w for t in train for w in t)
        unk = sum(c for w, c in words.items() if w not in vocab)
        total = sum(words.values())
        print(
            f"vocabulary: {len(vocab)} tokens ({splitter.name} tokenizer, min_word_freq {vocab.min_freq}) of "
            f"{counted(len(words), 'distinct training word')}; "
            f"{unk / max(total, 1):.2%} of training words become <unk>"
        )
        warning = lost_words_warning(words, vocab, min_word_freq)
        if warning:
            print(warning, file=sys.stderr)
        if out and not problems:  # a vocabulary of a dataset with problems is not written
            vocab.save(out)  # (parent folders are created)
            print(f"wrote {out}")
    length_report([len(t) for r in records for t in r.tokens])
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        return 1
    if to_webdataset:  # a dataset with problems is not written
        from captioning.data.formats.webdataset import write_shards

        if shards is not None:
            print("error: the dataset is WebDataset shards already", file=sys.stderr)
            return 1
        written = write_shards(records, images_root, to_webdataset, shard_size, progress=progress)
        for split, files in written.items():
            print(f"wrote {len(files)} {split} shard(s): {files[0]}{' ...' if len(files) > 1 else ''}")
        print(f"train from them: --data.annotations {to_webdataset}")
    return 0


@COMMANDS.register("prepare")
class Prepare(Command):
    help = "check a dataset (splits, images, caption lengths) and build its vocabulary"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--annotations",
            required=True,
            nargs="+",
            help="Karpathy split JSON, COCO caption JSON file(s), or a captions .csv / .jsonl",
        )
        p.add_argument(
            "--images-root",
            default=None,
            help="folder the image paths are relative to (default: the annotation file's)",
        )
        p.add_argument("--split-file", default=None, help="for COCO caption files: Karpathy's dataset_coco.json")
        p.add_argument(
            "--min-word-freq",
            type=at_least(1),
            default=5,
            help="rarer training words become <unk>, as in training (--data.min_word_freq, default 5); "
            "prepare names the words lost when they are many (a small set wants 1)",
        )
        p.add_argument("--max-vocab-size", type=at_least(0), default=None)
        p.add_argument(
            "--out", default=None, help="write the vocabulary JSON here (train with it: --data.vocabulary FILE)"
        )
        p.add_argument(
            "--tokenizer",
            default=None,
            help="how captions are split into tokens, as --data.tokenizer: words, chars, jieba, bpe, unigram "
            "(default: words, or jieba / chars for mostly-CJK captions; docs/LANGUAGES.md)",
        )
        p.add_argument(
            "--vocab-size", type=at_least(8), default=None, help="tokens of a trained tokenizer (bpe, unigram)"
        )
        p.add_argument("--no-image-check", action="store_true", help="skip reading every image")
        p.add_argument(
            "--to-webdataset",
            default=None,
            metavar="OUT",
            help="then write the dataset as WebDataset shards OUT/{split}-NNNNNN.tar (train with --data.annotations OUT)",
        )
        p.add_argument("--shard-size", type=at_least(1), default=1000, help="images per shard (--to-webdataset)")

    def run(self, args: argparse.Namespace) -> int:
        annotations = args.annotations[0] if len(args.annotations) == 1 else args.annotations
        return prepare(
            annotations,
            images_root=args.images_root,
            min_word_freq=args.min_word_freq,
            out=args.out,
            split_file=args.split_file,
            max_vocab_size=args.max_vocab_size,
            check=not args.no_image_check,
            to_webdataset=args.to_webdataset,
            shard_size=args.shard_size,
            tokenizer=args.tokenizer,
            vocab_size=args.vocab_size,
        )
