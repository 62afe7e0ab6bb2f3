"""The attention catalogue's study: every mechanism on the shapes data, seeds and equal steps.

    python -m tools.studies.catalogue_study run --data shapes=DATA.json --data hard=HARD.json \
        --steps 600 --seeds 0 1 --runs runs/catalogue [--mechanisms soft,uniform,...] [--threads 1]
    python -m tools.studies.catalogue_study before runs/catalogue --data shapes=DATA.json --data hard=HARD.json
    python -m tools.studies.catalogue_study steer runs/catalogue --data shapes=DATA.json --mechanisms hierarchical
    python -m tools.studies.catalogue_study table runs/catalogue > table.md

``run`` trains each mechanism (configs/shapes_<name>.yaml, the demo's recipe with the mechanism's
decoder) for ``--steps`` steps per data set and seed, then measures its best checkpoint on the test
split: the scores with grounding (``evaluate --grounding``), faithfulness (deletion of the attended
annotation vectors), and steering at each ``--strengths`` value (how often the caption names the
object whose box is the focus). ``before`` adds the maps' grounding at the word before each noun
(where a conv decoder's maps find the object). ``steer`` measures the steering of the named
mechanisms' runs again (after a change to how a focus reaches them), in place of what ``run``
measured. RUNS/<data>/<name>_s<seed>.json holds one run's
figures; a run whose file exists is skipped, so a stopped study resumes. ``table`` prints the
study's tables: the seeds'
mean and each seed. Data: ``make-shapes`` (the demo's preset) and ``make-shapes --preset hard``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from captioning.viz.atlas import CATALOGUE as ATLAS_CATALOGUE

#: The catalogue: the atlas's mechanisms (captioning/viz/atlas.py), each trained by its shapes config.
CATALOGUE = tuple(m.name for m in ATLAS_CATALOGUE)
STRENGTHS = (1.0, 3.0, 10.0)
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def best_checkpoint(root: Path) -> Path | None:
    """The best validation checkpoint a run under ``root`` saved (its last version's), or None."""
    best = sorted(root.glob("lightning_logs/version_*/checkpoints/best-*.ckpt"))
    return best[-1] if best else None


def fit(name: str, data: str, steps: int, seed: int, root: Path, threads: int | None) -> tuple[Path, float]:
    """Train one mechanism; (its best checkpoint, seconds a step took)."""
    best = best_checkpoint(root)
    timing = root / "seconds_per_step.txt"
    if best is not None and timing.exists():
        return best, float(timing.read_text())
    command = [
        sys.executable, "-m", "captioning.cli", "fit", "--config", str(CONFIGS / f"shapes_{name}.yaml"),
        "--data.annotations", data, "--trainer.max_steps", str(steps), "--trainer.max_time", "null",
        "--trainer.max_epochs", "10000", "--seed_everything", str(seed), "--trainer.default_root_dir", str(root),
    ] + (["--threads", str(threads)] if threads else [])  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(root.with_suffix(".fit.log"), "w", encoding="utf-8") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True)
    timing.write_text(f"{(time.perf_counter() - start) / steps:.4f}")
    return best_checkpoint(root), float(timing.read_text())


def measure(checkpoint: Path, data: str, strengths, faithfulness_images: int, beams: int) -> dict:
    """Scores with grounding, faithfulness and steering of one checkpoint on the test split."""
    from captioning.api import Captioner
    from captioning.cli.evaluate import evaluate
    from captioning.storage.load import load_model
    from tools.studies.attention_faithfulness_study import steering_or_reason

    model = load_model(str(checkpoint))
    generation = model.spec.generation.replace(num_beams=beams)
    try:
        report = evaluate(
            model, data, split="test", generation=generation, grounding=True, faithfulness=True,
            faithfulness_images=faithfulness_images, metrics=("BLEU", "CIDEr", "objects", "grounding"),
            tokenizer="python", progress=False,
        )  # fmt: skip
    except Exception as err:  # a mechanism faithfulness cannot take: the scores without it, and why
        report = evaluate(
            model, data, split="test", generation=generation, grounding=True,
            metrics=("BLEU", "CIDEr", "objects", "grounding"), tokenizer="python", progress=False,
        )  # fmt: skip
        report["faithfulness"] = {"unavailable": f"{type(err).__name__}: {err}"}
    captioner = Captioner.from_model(model, device="cpu")
    steer = [steering_or_reason(captioner, data, s, {"num_beams": beams}) for s in strengths]
    return {"scores": report["scores"], "faithfulness": report.get("faithfulness"), "steering": steer}


def run(args) -> None:
    if args.threads:  # the measurements run in this process: the same threads as the runs' training
        import torch

        torch.set_num_threads(args.threads)
    names = CATALOGUE if args.mechanisms in (None, "all") else tuple(args.mechanisms.split(","))
    missing = [n for n in names if not (CONFIGS / f"shapes_{n}.yaml").exists()]
    if missing:
        print(f"catalogue_study: no config for {', '.join(missing)}: skipped", file=sys.stderr)
    for item in args.data:
        label, _, data = item.partition("=")
        for seed in args.seeds:
            for name in (n for n in names if n not in missing):
                out = Path(args.runs) / label / f"{name}_s{seed}.json"
                if out.exists():
                    continue
                print(f"catalogue_study: {label} {name} seed {seed}", flush=True)
                try:
                    ckpt, per_step = fit(name, data, args.steps, seed, out.with_suffix(""), args.threads)
                    start = time.perf_counter()
                    result = measure(ckpt, data, args.strengths, args.faithfulness_images, args.beams)
                    result["seconds_measure"] = round(time.perf_counter() - start, 1)
                except (subprocess.CalledProcessError, OSError, RuntimeError, ValueError) as err:
                    print(f"catalogue_study: {label} {name} seed {seed} failed: {err}", file=sys.stderr)
                    continue
                result.update(name=name, seed=seed, data=label, steps=args.steps, seconds_per_step=per_step)
                out.write_text(json.dumps(result, indent=1), encoding="utf-8")


def before(args) -> None:
    """Add each run's grounding at the word before the noun (the noun's colour) to its JSON
    (``"before"``): maps that find the object a word early (a conv decoder's) score there."""
    import torch

    from captioning.api import Captioner
    from captioning.data.formats import load_records
    from tools.studies.grounding_shift import shift

    if args.threads:
        torch.set_num_threads(args.threads)
    for item in args.data:
        label, _, data = item.partition("=")
        records = {r.image_id: r for r in load_records(data) if r.split == "test"}
        for path in sorted(Path(args.runs, label).glob("*_s*.json")):
            result = json.loads(path.read_text(encoding="utf-8"))
            best = best_checkpoint(path.with_suffix(""))
            if "before" in result or best is None:
                continue
            print(f"catalogue_study: {label} {path.stem}: grounding at the word before", flush=True)
            captioner = Captioner.from_checkpoint(str(best), device="cpu")
            at_noun, at_before = shift(captioner, records, Path(data).parent, args.beams)
            keys = ("attention_correctness", "pointing_game", "count")
            result["before"] = {k: at_before.get(k) for k in keys}
            result["noun"] = {k: at_noun.get(k) for k in keys}
            path.write_text(json.dumps(result, indent=1), encoding="utf-8")


def steer(args) -> None:
    """Measure the steering of ``--mechanisms``' runs again and replace their ``"steering"``."""
    import torch

    from captioning.api import Captioner
    from captioning.data.formats import load_records
    from tools.studies.attention_faithfulness_study import steering_or_reason

    if args.threads:
        torch.set_num_threads(args.threads)
    runs = []  # (data, run's JSON): all found before anything is measured
    for item in args.data:
        label, _, data = item.partition("=")
        load_records(data)  # a missing or unreadable data file: one line
        folder = Path(args.runs, label)
        for name in args.mechanisms.split(","):
            found = [
                p for p in sorted(folder.glob(f"{name}_s*.json")) if re.fullmatch(rf"{re.escape(name)}_s\d+", p.stem)
            ]
            if not found:  # a misspelt mechanism or runs folder
                raise FileNotFoundError(f"no runs of {name!r} in {folder}")
            runs += [(data, path) for path in found]
    for data, path in runs:
        best = best_checkpoint(path.with_suffix(""))
        if best is None:
            continue
        print(f"catalogue_study: {path.parent.name} {path.stem}: steering", flush=True)
        result = json.loads(path.read_text(encoding="utf-8"))
        captioner = Captioner.from_checkpoint(str(best), device="cpu")
        result["steering"] = [steering_or_reason(captioner, data, s, {"num_beams": args.beams}) for s in args.strengths]
        path.write_text(json.dumps(result, indent=1), encoding="utf-8")


# ---------------------------------------------------------------------------------------- the table
def figures(r: dict) -> dict:
    s = r["scores"]
    faith = r.get("faithfulness") or {}
    area = None
    if "removal" in faith and "object" in faith["removal"].get("mean", {}):
        a = faith["removal"]["mean"]["object"]["area"]
        area = a["deletion_random"] - a["deletion_top"]  # how much more the attended cells matter
    needed = None
    for st in r.get("steering", []):
        if "unavailable" not in st and st["named_only_focused"] >= 0.5:
            needed = st["strength"]
            break
    steerable = any("unavailable" not in st for st in r.get("steering", []))
    return {
        "f1": s.get("object_f1"),
        "cider": s.get("CIDEr"),
        "correct": (s.get("grounding") or {}).get("attention_correctness"),
        "pointing": (s.get("grounding") or {}).get("pointing_game"),
        "faith": area,
        "steer": needed if needed is not None else (math.inf if steerable else None),
        "before": (r.get("before") or {}).get("attention_correctness"),
        "step": r.get("seconds_per_step"),
    }


def cell(v, fmt="{:.3f}") -> str:
    if v is None:
        return "-"
    if v == math.inf:
        return f"> {max(STRENGTHS):g}"
    return fmt.format(v)


def table(args) -> None:
    for folder in sorted(p for p in glob.glob(os.path.join(args.runs, "*")) if os.path.isdir(p)):
        groups: dict[str, list[dict]] = {}
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            if re.search(r"_s\d+\.json$", path):
                r = json.loads(Path(path).read_text(encoding="utf-8"))
                groups.setdefault(r["name"], []).append(r)
        if not groups:
            continue
        steps = {r["steps"] for rs in groups.values() for r in rs}
        print(f"\n### {os.path.basename(folder)} ({', '.join(map(str, sorted(steps)))} steps)\n")
        print(
            "| mechanism | seeds | object F1 | CIDEr | attention correctness | pointing game | "
            "correctness at the word before | faithfulness: deletion area, random - attended | "
            "steering strength for 50% | s/step |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        order = [n for n in CATALOGUE if n in groups] + sorted(n for n in groups if n not in CATALOGUE)
        for name in order:
            runs = sorted(groups[name], key=lambda r: r["seed"])
            fs = [figures(r) for r in runs]

            def mean(key, fmt="{:.3f}"):
                vals = [f[key] for f in fs if f[key] is not None]
                if not vals:
                    return "-"
                each = " / ".join(cell(f[key], fmt) for f in fs)
                m = sum(vals) / len(vals)
                return f"{cell(m, fmt)} ({each})" if len(fs) > 1 else cell(m, fmt)

            steer = " / ".join(cell(f["steer"], "{:g}") for f in fs)
            print(
                f"| {name} | {len(runs)} | {mean('f1')} | {mean('cider', '{:.2f}')} | {mean('correct')} | "
                f"{mean('pointing')} | {mean('before')} | {mean('faith')} | {steer} | {mean('step', '{:.2f}')} |"
            )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.studies.catalogue_study", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train and measure every mechanism")
    r.add_argument("--data", action="append", required=True, metavar="LABEL=DATA.json")
    r.add_argument("--steps", type=int, default=600)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--runs", default="runs/catalogue")
    r.add_argument("--mechanisms", default=None, help="NAME,NAME,... (default: the whole catalogue)")
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--beams", type=int, default=3)
    r.add_argument("--strengths", type=float, nargs="+", default=list(STRENGTHS))
    r.add_argument("--faithfulness-images", type=int, default=60)
    b = sub.add_parser("before", help="add grounding at the word before each noun to RUNS' results")
    b.add_argument("runs")
    b.add_argument("--data", action="append", required=True, metavar="LABEL=DATA.json")
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--beams", type=int, default=3)
    st = sub.add_parser("steer", help="measure the steering of some mechanisms' runs again")
    st.add_argument("runs")
    st.add_argument("--data", action="append", required=True, metavar="LABEL=DATA.json")
    st.add_argument("--mechanisms", required=True, help="NAME,NAME,...")
    st.add_argument("--threads", type=int, default=None)
    st.add_argument("--beams", type=int, default=3)
    st.add_argument("--strengths", type=float, nargs="+", default=list(STRENGTHS))
    t = sub.add_parser("table", help="the study's tables from RUNS")
    t.add_argument("runs")
    args = p.parse_args(argv)
    from captioning.errors import CaptioningError

    try:
        {"run": run, "before": before, "steer": steer, "table": table}[args.command](args)
    except (CaptioningError, OSError) as err:  # a missing or unreadable data file: one line, exit 1
        sys.exit(f"catalogue_study {args.command}: {err}")


if __name__ == "__main__":
    main()
