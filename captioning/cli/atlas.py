"""``captioning atlas``: the attention catalogue on one image and one word, a panel per model.

    captioning atlas IMAGE --checkpoint A --checkpoint NAME=B ... --out atlas.png [--word circle]
    captioning atlas IMAGE --train-all 300 --annotations shapes/dataset_shapes.json --out atlas.png

Each panel (captioning/viz/atlas.py) is titled with the model's mechanism and its equation, shows
the chosen word's attention map over the image, the caption and, when the image's objects are known
(shapes data: ``--annotations``, or the ``dataset_shapes.json`` above the image), its object F1.
The word is ``--word`` or the first object word every caption names. ``--train-all STEPS`` first
trains every mechanism of the catalogue whose config exists (configs/shapes_<name>.yaml) for STEPS
steps on the shapes data, into ``--runs`` (a mechanism already trained there for STEPS is reused).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least, fraction, generation_args, generation_overrides, refuse_urls
from captioning.errors import ConfigError

DEFAULT_RUNS = "outputs/atlas"


def split_spec(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a plain path (or one that exists as given) -> (None, PATH)."""
    match = re.fullmatch(r"([\w.\-]+)=(.+)", spec)
    if match and not os.path.exists(spec):
        return match.group(1), match.group(2)
    return None, spec


def chosen_mechanisms(names: str | None):
    """The catalogue's mechanisms ``--mechanisms`` names (comma-separated; None: all), in its order."""
    from captioning.viz.atlas import CATALOGUE, MECHANISMS

    if names is None:
        return list(CATALOGUE)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in MECHANISMS]
    if unknown or not wanted:
        raise ConfigError(
            f"--mechanisms: unknown mechanism {unknown[0] if unknown else names!r}; the catalogue: {', '.join(MECHANISMS)}"
        )
    return [m for m in CATALOGUE if m.name in wanted]


def train_all(mechanisms, steps: int, annotations: Path, runs: Path, device: str | None, seed: int) -> list[str]:
    """Train each mechanism's shapes config for ``steps`` steps on ``annotations`` into ``runs/<name>``
    (reused when a run of as many steps is there); a mechanism whose config this checkout lacks is
    skipped with a note. Returns ``NAME=CHECKPOINT`` of each trained one."""
    from captioning.cli.demo import budget_args
    from captioning.files import atomic_write_json
    from captioning.training.cli import run_lightning_cli

    configs = Path(__file__).resolve().parents[2] / "configs"
    present = [m for m in mechanisms if (configs / m.config).is_file()]
    for m in mechanisms:
        if m not in present:
            print(f"note: skipped {m.name}: configs/{m.config} is not in this checkout", file=sys.stderr)
    specs = []
    for k, m in enumerate(present, 1):
        folder = runs / m.name
        record = folder / "atlas_run.json"
        done = json.loads(record.read_text()) if record.is_file() else {}
        if done.get("steps") == steps and Path(done.get("checkpoint", "")).is_file():
            print(
                f"[{k}/{len(present)}] {m.name}: trained for {steps:,} steps already ({done['checkpoint']})", flush=True
            )
            specs.append(f"{m.name}={done['checkpoint']}")
            continue
        print(f"[{k}/{len(present)}] training {m.name} (configs/{m.config}) for {steps:,} steps", flush=True)
        args = ["fit", "--config", str(configs / m.config), "--data.annotations", str(annotations)]
        args += ["--trainer.default_root_dir", str(folder), "--seed_everything", str(seed)]
        args += ["--trainer.enable_progress_bar", "false"] + budget_args(steps)
        if device is not None:
            args += ["--trainer.accelerator", "cpu" if device == "cpu" else "gpu"]
        start = time.perf_counter()
        cli = run_lightning_cli(args)
        callback = cli.trainer.checkpoint_callback
        checkpoint = callback.best_model_path or callback.last_model_path
        atomic_write_json(record, {"steps": steps, "checkpoint": checkpoint, "config": m.config})
        print(
            f"      {cli.trainer.global_step:,} steps in {time.perf_counter() - start:.0f} s -> {checkpoint}",
            flush=True,
        )
        specs.append(f"{m.name}={checkpoint}")
    return specs


@COMMANDS.register("atlas")
class Atlas(Command):
    help = "one picture of the attention catalogue: a panel per model on one image and one word, with its equation"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("image", help="the image every model looks at (a file)")
        p.add_argument(
            "--checkpoint",
            action="append",
            default=[],
            metavar="[NAME=]CKPT",
            help="a checkpoint or model folder: one panel each (repeat it); NAME labels its panel",
        )
        p.add_argument("--out", required=True, help="the atlas, a .png file")
        p.add_argument(
            "--word",
            default=None,
            help="the word every panel shows (default: the first object word the captions share)",
        )
        p.add_argument(
            "--annotations",
            default=None,
            help="the shapes data's annotation file: the image's objects for object F1, and --train-all's data "
            "(default: the dataset_shapes.json above the image, if any)",
        )
        p.add_argument(
            "--train-all",
            type=at_least(1),
            default=None,
            metavar="STEPS",
            help="first train every catalogue mechanism whose configs/shapes_<name>.yaml exists for STEPS steps "
            "on the shapes data (--annotations), each a panel",
        )
        p.add_argument(
            "--mechanisms", default=None, metavar="NAME,...", help="with --train-all: these only (default: all)"
        )
        p.add_argument(
            "--runs", default=DEFAULT_RUNS, help=f"with --train-all: where the runs go (default {DEFAULT_RUNS})"
        )
        p.add_argument("--seed", type=int, default=0, help="with --train-all: the runs' seed")
        p.add_argument("--cols", type=at_least(1), default=4, help="panels a row")
        p.add_argument("--panel-size", type=at_least(64), default=240, help="the image's long side in a panel, pixels")
        p.add_argument("--alpha", type=fraction, default=0.6, help="heatmap opacity")
        generation_args(p, checkpoint=False)

    def run(self, args: argparse.Namespace) -> int:
        refuse_urls([args.image])
        out = Path(args.out)
        if out.suffix.lower() != ".png":
            raise ConfigError(f"--out {out}: the atlas is a .png file")
        if not args.checkpoint and args.train_all is None:
            raise ConfigError("atlas: give the models, --checkpoint CKPT (repeat it), or --train-all STEPS")
        if args.mechanisms is not None and args.train_all is None:
            raise ConfigError("--mechanisms: chooses what --train-all trains; give --train-all STEPS")
        mechanisms = chosen_mechanisms(args.mechanisms)
        from captioning.cli.options import apply_image_limit, check_generation_flags
        from captioning.data.images import load_image

        apply_image_limit(args)
        check_generation_flags(args)
        image = load_image(args.image)  # an unreadable image: one line, before any training
        from captioning.viz.atlas import find_annotations, image_objects

        annotations = Path(args.annotations) if args.annotations else find_annotations(args.image)
        if args.annotations and not annotations.is_file():
            raise ConfigError(f"--annotations: no such file: {annotations}")
        specs = list(args.checkpoint)
        if args.train_all is not None:
            if annotations is None:
                raise ConfigError(
                    "--train-all: trains on the shapes data: give --annotations DATASET_JSON "
                    "(captioning make-shapes --out DIR writes DIR/dataset_shapes.json)"
                )
            specs = train_all(mechanisms, args.train_all, annotations, Path(args.runs), args.device, args.seed) + specs
        objects, why = image_objects(args.image, annotations) if annotations is not None else (None, None)
        if why:
            print(f"note: no object F1: {why}", file=sys.stderr)
        picture, panels = make_atlas(image, specs, args, objects)
        from captioning.viz.pictures import save_png

        out.parent.mkdir(parents=True, exist_ok=True)
        save_png(picture, out)
        for panel in panels:
            f1 = "" if panel.f1 is None else f"{panel.f1:.2f}"
            print(f"{panel.label}\t{panel.mechanism}\t{' '.join(panel.words)}\t{panel.word or ''}\t{f1}")
        print(f"-> {out} ({len(panels)} panels)", file=sys.stderr)
        return 0


def make_atlas(image, specs: list[str], args, objects):
    """The atlas picture and its panels: each spec's model captions the image (the command's decoding
    flags), then viz/atlas.py draws them."""
    from captioning.api import Captioner
    from captioning.viz.atlas import atlas_panels, render_atlas

    overrides = generation_overrides(args)
    models = []
    for spec in specs:
        label, path = split_spec(spec)
        captioner = Captioner.from_checkpoint(path, args.device)
        [result] = captioner(image, return_attention=True, **overrides)
        decoder = captioner.spec.decoder
        models.append((label or Path(path).stem, decoder, result, captioner.attention_kind == "hard"))
    panels, word, note = atlas_panels(models, args.word, objects)
    for panel in panels:  # a label that only repeats the file name of a mechanism's run adds nothing
        if panel.label in ("best", "last") or panel.label.startswith(("best-", "last-")):
            panel.label = ""
    if note:
        print(f"note: {note}", file=sys.stderr)
    picture = render_atlas(image, panels, word, note, args.cols, args.panel_size, args.alpha)
    return picture, panels
