"""Command-line options that several commands share (the CLI, tools/, the web server).

Kept apart from cli.py so that a tool can use them without importing the command itself, and
light: nothing here imports torch.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Optional

from captioning.models import ATTENTION_MODES


class ShortErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the command, the problem, where to look)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def at_least(least: float, kind: type = int):
    """An argparse type: a number of ``kind`` that is at least ``least`` (its error names the bound)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def finite(least: float, strict: bool = False):
    """An argparse type: a finite number >= ``least`` (> ``least`` when ``strict``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < least or (strict and value == least):
            raise argparse.ArgumentTypeError(f"expected a finite number {'>' if strict else '>='} {least:g}, got {text}")
        return value

    parse.__name__ = "float"
    return parse


def probability(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    value = finite(0.0, strict=True)(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text}")
    return value


def token_list(text: str) -> tuple:
    """An argparse type: comma-separated token ids or words ("<unk>,3"), as a tuple of ints and strings."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids or words, got {text!r}")
    return tuple(int(t) if t.lstrip("-").isdigit() else t for t in items)


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    value = at_least(0.0, float)(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


def report_skipped(bad: list) -> None:
    for _, reason in bad:
        print(f"skipped: {reason}", file=sys.stderr)
    if bad:
        print(f"{len(bad)} image(s) skipped", file=sys.stderr)


#: what --checkpoint takes, in every command's help
CHECKPOINT_HELP = "a checkpoint written by `captioning fit`, or a model folder written by `captioning export`"
ENSEMBLE_HELP = ("; given several times, an ensemble of models of one vocabulary: their log-probabilities averaged "
                 "at each step (docs/EVALUATION.md, Ensembles)")


def weight_list(text: str) -> tuple[float, ...]:
    """--ensemble-weights: comma-separated non-negative numbers, e.g. 0.7,0.3."""
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.7,0.3, got {text!r}") from None
    if any(not (w >= 0 and math.isfinite(w)) for w in weights) or sum(weights) <= 0:
        raise argparse.ArgumentTypeError(f"expected non-negative numbers with a positive sum, got {text!r}")
    return weights


def checkpoints_and_weights(args) -> tuple[list[str], Optional[tuple[float, ...]]]:
    """The command's --checkpoint paths (one or more) and --ensemble-weights (None: equal), checked
    to agree in number (a one-line ConfigError otherwise)."""
    from captioning.errors import ConfigError

    paths, weights = list(args.checkpoint or []), getattr(args, "ensemble_weights", None)
    if weights is not None and len(weights) != len(paths):
        what = "--onnx" if not paths else f"{len(paths)} --checkpoint"
        raise ConfigError(f"--ensemble-weights: {len(weights)} weights for {what}; give one weight per --checkpoint")
    return paths, weights


def generation_args(p: argparse.ArgumentParser, beams: int = 3, checkpoint: bool = True, onnx: bool = False) -> None:
    """The checkpoint (unless ``checkpoint`` is false; with ``onnx``, or an ONNX folder instead),
    the decoding settings (GenerationConfig's fields) and the device of a command."""
    if checkpoint and onnx:
        model = p.add_mutually_exclusive_group(required=True)
        model.add_argument("--checkpoint", action="append", help=CHECKPOINT_HELP + ENSEMBLE_HELP)
        model.add_argument("--onnx", metavar="FOLDER",
                           help="an ONNX folder written by `captioning export --format onnx`: runs with onnxruntime, without PyTorch")
    elif checkpoint:
        p.add_argument("--checkpoint", action="append", required=True, help=CHECKPOINT_HELP + ENSEMBLE_HELP)
    if checkpoint:
        p.add_argument("--ensemble-weights", type=weight_list, default=None, metavar="W1,W2,...",
                       help="with several --checkpoint: the models' weights in the average of their log-probabilities, "
                            "in --checkpoint order (normalised to sum 1; default equal)")
    p.add_argument("--num-beams", type=at_least(1), default=beams, help=f"beams per image (1: greedy; default {beams})")
    p.add_argument("--max-new-tokens", type=at_least(1), default=None, help="longest caption (default: the model's)")
    p.add_argument("--length-penalty", type=float, default=None, help="scores are divided by length**this")
    p.add_argument("--attention-mode", choices=ATTENTION_MODES, default=None,
                   help="how a hard-attention model picks contexts (default: the model's, normally expected)")
    p.add_argument("--attention-temperature", type=float, default=None, metavar="TAU",
                   help="hard attention, expected context: take it under softmax(log alpha / TAU); below 1 sharpens it "
                        "towards the likeliest location's (default 1: the expected context)")
    p.add_argument("--forbid-bad-endings", action="store_true", default=None,
                   help="never end a caption on an article, preposition or conjunction ('a', 'with', 'and'...)")
    p.add_argument("--location-samples", type=at_least(1), default=None, metavar="K",
                   help="hard attention: decode each image K times with sampled locations and keep the best-scoring caption")
    p.add_argument("--num-beam-groups", type=at_least(1), default=None, metavar="G",
                   help="diverse beam search: the beams form G groups (G divides --num-beams), each penalised for "
                        "the words the earlier groups chose at the same step (needs --diversity-penalty)")
    p.add_argument("--diversity-penalty", type=finite(0.0), default=None,
                   help="diverse beam search: subtracted from a word's score per earlier group that chose it")
    p.add_argument("--no-repeat-ngram-size", type=at_least(0), default=None, metavar="N",
                   help="never repeat an n-gram of N words within a caption (3: block trigrams)")
    p.add_argument("--repetition-penalty", type=finite(0.0, strict=True), default=None,
                   help="multiply the log-probability of words already in the caption by this (> 1 discourages repeats)")
    p.add_argument("--do-sample", action="store_true", default=None,
                   help="sample each word from the model's distribution (one beam: --num-beams 1)")
    p.add_argument("--top-p", type=probability, default=None,
                   help="with --do-sample: sample among the likeliest words of total probability P (nucleus sampling)")
    p.add_argument("--min-new-tokens", type=at_least(0), default=None, metavar="N",
                   help="captions of at least N words (EOS is forbidden before)")
    p.add_argument("--suppress-tokens", type=token_list, default=None, metavar="TOKENS",
                   help="comma-separated words or token ids never generated, e.g. '<unk>'")
    p.add_argument("--cuda-graphs", action="store_true", default=None,
                   help="on a CUDA device, replay each decoding step as a captured CUDA graph (the same captions)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if available)")
    p.add_argument("--max-image-pixels", type=at_least(1), default=None, metavar="N",
                   help="refuse images of more pixels (decompression-bomb guard; default: Pillow's, about 89 million)")


def generation_overrides(args) -> dict:
    """The GenerationConfig fields a command's arguments set (None: keep the model's)."""
    return {"num_beams": args.num_beams, "max_new_tokens": args.max_new_tokens,
            "length_penalty": args.length_penalty, "attention_mode": args.attention_mode,
            "attention_temperature": getattr(args, "attention_temperature", None),
            "forbid_bad_endings": args.forbid_bad_endings,
            "location_samples": getattr(args, "location_samples", None),
            "cuda_graphs": getattr(args, "cuda_graphs", None),
            **{field: getattr(args, field, None) for field in (
                "num_beam_groups", "diversity_penalty", "no_repeat_ngram_size", "repetition_penalty", "do_sample",
                "top_p", "min_new_tokens", "suppress_tokens")}}


def apply_image_limit(args) -> None:
    """``--max-image-pixels``: the process's decompression-bomb limit."""
    if getattr(args, "max_image_pixels", None) is not None:
        from PIL import Image

        from captioning.errors import ConfigError

        if args.max_image_pixels < 1:
            raise ConfigError(f"--max-image-pixels: expected a positive number, got {args.max_image_pixels}")
        Image.MAX_IMAGE_PIXELS = args.max_image_pixels
