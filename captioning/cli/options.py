"""Command-line options that several commands share (the commands, the web server's).

Kept apart from the commands so that each can use them without importing another, and light:
nothing here imports torch.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence

from captioning.decoding.generation import GenerationOption, flag_words, generation_options, relation_problem
from captioning.errors import ConfigError


class ShortErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the command, the problem, where to look), with
    the nearest valid flag or choice for a misspelt one ("did you mean --num-beams?")."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message}{self.suggestion(message)} (see {self.prog} --help)\n")

    def suggestion(self, message: str) -> str:
        """ "; did you mean X?" for the unknown flags or the invalid choice ``message`` names ("" if none is near)."""
        from captioning.common import did_you_mean

        if message.startswith("unrecognized arguments:"):
            flags = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
            return did_you_mean(flags, [o for a in self._actions for o in a.option_strings if o.startswith("--")])
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)'", message)
        if choice:
            names = choice.group(1).split("/")
            for action in self._actions:
                if action.choices and (set(names) & set(action.option_strings) or action.dest in names):
                    return did_you_mean([choice.group(2)], [str(c) for c in action.choices])
        return ""


def at_least(least: float, kind: type = int):
    """An argparse type: a number of ``kind`` that is at least ``least`` (its error names the bound)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value) or value < least:  # int() never gives nan; float() does
            finite = "a finite number" if kind is float else "a number"
            raise argparse.ArgumentTypeError(f"expected {finite} >= {least}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    value = at_least(0.0, float)(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


#: the images' positional argument, in the help of the commands that read image files
IMAGES_HELP = "image files, folders (searched with their subfolders) or glob patterns; local files, not URLs"
#: the images' positional argument of the streaming commands (caption, attend: data/inputs.py)
STREAM_HELP = (
    "image files, folders (searched with their subfolders), glob patterns, @LIST.txt (a file of image paths, "
    "one per line) or WebDataset shards (x.tar, x-{000..009}.tar); local files, not URLs"
)


def layer_choice(text: str) -> int | str:
    """``--layer``'s value: a layer's number or "mean"."""
    if text == "mean":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a layer's number or 'mean', got {text!r}") from None


def layer_arg(p: argparse.ArgumentParser, use: str) -> None:
    """``--layer L|mean``: a transformer's cross-attention maps of layer L, or their mean over the layers."""
    p.add_argument(
        "--layer",
        type=layer_choice,
        default=None,
        metavar="L|mean",
        help=f"transformer models: the decoder layer whose cross-attention maps are {use}, or 'mean' "
        "(their mean over the layers; default: the model's decoder.attention_layer, else the first; "
        "negative counts from the end)",
    )


def choose_layer(model, layer: int | str | None):
    """``--layer``'s choice applied to ``model`` (a model or an ensemble; None: as it is)."""
    if layer is None:
        return model
    from captioning.models.transformer import choose_attention_layer

    return choose_attention_layer(model, layer)


def loader_args(p: argparse.ArgumentParser, batch_size: int = 16) -> None:
    """--batch-size and --num-workers: how a streaming command reads its images (data/inputs.py)."""
    p.add_argument(
        "--batch-size", type=at_least(1), default=batch_size, metavar="N", help="images decoded and captioned at once"
    )
    p.add_argument(
        "--num-workers",
        type=at_least(0),
        default=0,
        metavar="N",
        help="processes that read and resize the images while the model works (0: the main process)",
    )


THREADS_HELP = (
    "PyTorch's intra-op threads (default: chosen from the cores other processes leave free: one when "
    "the machine is busy; or OMP_NUM_THREADS when set; docs/PERFORMANCE.md, Threads)"
)


def threads_arg(p: argparse.ArgumentParser) -> None:
    """``--threads N``: PyTorch's threads for a command that computes (applied by cli/main.py:
    :func:`apply_threads`, before the command runs)."""
    p.add_argument("--threads", type=at_least(1), default=None, metavar="N", help=THREADS_HELP)


def apply_threads(args: argparse.Namespace) -> None:
    """Set PyTorch's threads for a command with ``--threads`` (common.py: ``use_threads``: the
    flag, else OMP_NUM_THREADS, else the free cores), quietly: stderr keeps its one-line errors.
    Nothing for a command without the flag, or one that runs without PyTorch (``--onnx``)."""
    if not hasattr(args, "threads") or getattr(args, "onnx", None):
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from captioning.common import use_threads

    use_threads(args.threads)


def runnable(script: str = "captioning") -> str:
    """How to run this environment's ``script`` (captioning, tensorboard, pip) from the current folder,
    for the commands a command prints: its name when the shell finds this environment's, else its
    path (``.venv/bin/captioning`` under the current folder: an environment that is not activated)."""
    import shutil
    from pathlib import Path

    folder = Path(sys.executable).parent  # the environment's bin/ (Scripts\ on Windows)
    mine = next((p for p in (folder / script, folder / f"{script}.exe") if p.is_file()), None)
    found = shutil.which(script)
    if mine is None:  # e.g. run as python -m captioning.cli from a checkout without installing it
        return f"{sys.executable} -m captioning.cli" if script == "captioning" and not found else script
    if found and Path(found).resolve() == mine.resolve():
        return script
    try:
        return str(mine.relative_to(Path.cwd()))  # a path with a slash: the shell runs it without a PATH search
    except ValueError:
        return str(mine)


def refuse_urls(items: Sequence[str]) -> None:
    """A one-line error for an argument that is a URL (http://, https://, s3://...): images are read
    from files only."""
    for item in items:
        scheme, sep, _ = item.partition("://")
        if sep and scheme.isalnum():
            raise ConfigError(f"{item}: URLs are not read: download it first (e.g. curl -O {item}), then give the file")


def image_paths(items: Sequence[str]) -> list[str]:
    """The image files the arguments name, in the order given (data/images.py: ``expand_image_paths``: a
    folder's images with its subfolders', a glob pattern's matches, a file as it is)."""
    from captioning.data.images import expand_image_paths

    return expand_image_paths(items)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for one: "1 image", "12 images", "1,500 steps"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def report_skipped(bad: list) -> None:
    for _, reason in bad:
        print(f"skipped: {reason}", file=sys.stderr)
    if bad:
        print(f"{counted(len(bad), 'image')} skipped", file=sys.stderr)


#: what --checkpoint takes, in every command's help
CHECKPOINT_HELP = "a checkpoint written by `captioning fit`, or a model folder written by `captioning export`"
ENSEMBLE_HELP = (
    "; given several times, an ensemble of models of one vocabulary: their log-probabilities averaged "
    "at each step (docs/EVALUATION.md, Ensembles)"
)


def weight_list(text: str) -> tuple[float, ...]:
    """--ensemble-weights: comma-separated non-negative numbers, e.g. 0.7,0.3."""
    try:
        weights = tuple(float(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 0.7,0.3, got {text!r}") from None
    if any(not (w >= 0 and math.isfinite(w)) for w in weights) or sum(weights) <= 0:
        raise argparse.ArgumentTypeError(f"expected non-negative numbers with a positive sum, got {text!r}")
    return weights


def checkpoints_and_weights(args) -> tuple[list[str], tuple[float, ...] | None]:
    """The command's --checkpoint paths (one or more) and --ensemble-weights (None: equal), checked
    to agree in number (a one-line ConfigError otherwise)."""
    paths, weights = list(args.checkpoint or []), getattr(args, "ensemble_weights", None)
    if weights is not None and len(weights) != len(paths):
        what = "--onnx" if not paths else f"{len(paths)} --checkpoint"
        raise ConfigError(f"--ensemble-weights: {len(weights)} weights for {what}; give one weight per --checkpoint")
    return paths, weights


#: a decoding flag's default, in its help: the model's own setting
THE_MODELS = "the model's"
#: Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS), the default of --max-image-pixels:
#: quoted here without importing Pillow; a test keeps it equal to Pillow's
PILLOW_PIXELS = 89_478_485


def option_type(option: GenerationOption):
    """An argparse type for a decoding option: its text converted and checked by the option itself,
    so a flag refuses what the config refuses, in the same words."""

    def parse(text: str):
        try:
            value = option.convert(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        problem = option.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = option.type.__name__  # argparse names the type in its messages
    return parse


#: the beams of the commands that decode (caption, attend, evaluate, serve's form); the API's default is one
#: (Hugging Face's), which README's first example and ``captioning --help`` state beside this one
COMMAND_BEAMS = 3


def generation_args(
    p: argparse.ArgumentParser, beams: int = COMMAND_BEAMS, checkpoint: bool = True, onnx: bool = False
) -> None:
    """The checkpoint (unless ``checkpoint`` is false; with ``onnx``, or an ONNX folder instead),
    the decoding settings and the device of a command.

    The decoding flags are GenerationConfig's fields with ``cli`` true (decoding/generation.py:
    ``generation_options()``; a registered logits processor's options too), each with its help,
    bounds and choices; they default to None (the model's own setting), except ``--num-beams``,
    whose default is the command's (``beams``), or 1 when the flags ask for sampling
    (:func:`generation_settings`)."""
    if checkpoint and onnx:
        model = p.add_mutually_exclusive_group(required=True)
        model.add_argument("--checkpoint", action="append", help=CHECKPOINT_HELP + ENSEMBLE_HELP)
        model.add_argument(
            "--onnx",
            metavar="FOLDER",
            help="an ONNX folder written by `captioning export --format onnx`: runs with onnxruntime, without PyTorch",
        )
    elif checkpoint:
        p.add_argument("--checkpoint", action="append", required=True, help=CHECKPOINT_HELP + ENSEMBLE_HELP)
    if checkpoint:
        p.add_argument(
            "--ensemble-weights",
            type=weight_list,
            default=None,
            metavar="W1,W2,...",
            help="with several --checkpoint: the models' weights in the average of their log-probabilities, "
            "in --checkpoint order (normalised to sum 1; default equal)",
        )
    p.set_defaults(default_beams=beams)
    for option in generation_options():
        if not option.cli:
            continue
        if option.name == "num_beams":
            help = (
                f"{in_flags(option.help)}; default: {beams}, or 1 with --do-sample, --top-p, --top-k or --temperature"
            )
        else:
            help = f"{in_flags(option.help)}; default: {THE_MODELS}"
        if option.name in SAMPLING:
            help += "; implies --do-sample unless --num-beams is above 1"
        if option.type is bool:
            p.add_argument(option.flag, action="store_true", default=None, help=help)
        elif option.choices:
            p.add_argument(option.flag, choices=option.choices, default=None, help=help)
        else:
            p.add_argument(option.flag, type=option_type(option), default=None, metavar=option.metavar, help=help)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if available)")
    threads_arg(p)
    p.add_argument(
        "--max-image-pixels",
        type=at_least(1),
        default=None,
        metavar="N",
        help=f"refuse images of more pixels (decompression-bomb guard; default: Pillow's, {PILLOW_PIXELS:,})",
    )


def in_flags(text: str) -> str:
    """An option's help with the decoding fields it names as their flags ("with do_sample" ->
    "with --do-sample"), as the command line's help says them."""
    names = "|".join(o.name for o in generation_options() if o.cli)
    return re.sub(rf"(?<![\w-])({names})(?!\w)", lambda m: flag_words(m.group(1)), text)


#: the flags that only mean something when sampling, with their values that change nothing
SAMPLING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}


def generation_settings(args) -> tuple[dict, str | None]:
    """The GenerationConfig fields a command's arguments set (None: keep the model's), and a note
    (one line) when the flags implied some of them.

    Sampling draws one caption per image: ``--do-sample`` without ``--num-beams`` decodes with one
    beam, and a sampling option (``--temperature``, ``--top-k``, ``--top-p``) given without
    ``--do-sample`` samples, unless ``--num-beams`` asks for more than one beam (then the
    config's checks say what does not go together). Otherwise ``--num-beams`` defaults to the
    command's number."""
    values = {option.name: getattr(args, option.name, None) for option in generation_options() if option.cli}
    beams, implied = values.get("num_beams"), []
    given = [name for name, neutral in SAMPLING.items() if values.get(name) not in (None, neutral)]
    asked = ["do_sample"] if values.get("do_sample") else given
    if given and not values.get("do_sample") and beams in (None, 1):
        values["do_sample"] = True
        implied.append(flag_words("do_sample"))
    if beams is None:
        values["num_beams"] = 1 if values.get("do_sample") else getattr(args, "default_beams", None)
        if values.get("do_sample"):
            implied.append(f"{flag_words('num_beams')} 1")
    if not implied:
        return values, None
    return values, (
        f"note: {', '.join(map(flag_words, asked))} samples one caption per image: decoding with {' '.join(implied)}"
    )


def generation_overrides(args) -> dict:
    """The GenerationConfig fields a command's arguments set (None: keep the model's)."""
    return generation_settings(args)[0]


def check_generation_flags(args, base=None):
    """The decoding settings of a command: ``base`` (a GenerationConfig; default: its defaults) with
    the arguments' settings, checked in the flags' words (one-line ConfigError); prints the note of
    :func:`generation_settings` once, to stderr."""
    from captioning.decoding.generation import GenerationConfig

    overrides, note = generation_settings(args)
    base = base or GenerationConfig()
    changes = {k: v for k, v in overrides.items() if v is not None}
    merged = {o.name: getattr(base, o.name) for o in generation_options()} | changes  # every field, a plugin's too
    problem = relation_problem(argparse.Namespace(**merged), flag_words)
    if problem:
        raise ConfigError(problem)
    if note:
        print(note, file=sys.stderr)
    return base.replace(**changes)


def apply_image_limit(args) -> None:
    """``--max-image-pixels``: the process's decompression-bomb limit."""
    if getattr(args, "max_image_pixels", None) is not None:
        from PIL import Image

        if args.max_image_pixels < 1:
            raise ConfigError(f"--max-image-pixels: expected a positive number, got {args.max_image_pixels}")
        Image.MAX_IMAGE_PIXELS = args.max_image_pixels
