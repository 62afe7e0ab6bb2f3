"""The SCST table of docs/studies/SCST.md: cross-entropy, then SCST (greedy / mean baseline), soft and hard attention,
on the demo's shapes data; each model evaluated on the test split with beam search (3 beams).

    python -m tools.studies.scst_experiment --data outputs/demo/data/dataset_shapes.json --out runs/scst run ce_soft
    python -m tools.studies.scst_experiment ... run ce_hard
    python -m tools.studies.scst_experiment ... run scst_soft_greedy      # needs ce_soft (or --ce-soft CKPT)
    python -m tools.studies.scst_experiment ... run scst_soft_mean scst_hard_greedy scst_hard_mean
    python -m tools.studies.scst_experiment --out runs/scst table         # the markdown table of what has run

Runs go one after another (their budgets are wall-clock time: run nothing else meanwhile). Each
writes OUT/NAME/run.json: the fit command, its wall time, the steps it reached, the checkpoint
evaluated (the best by validation CIDEr), its test scores and the bad-ending rate of its test
captions (the share whose last word is an article, preposition or conjunction).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

from captioning.decoding.search import BAD_ENDINGS  # noqa: E402
from captioning.tokenizers import tokenize  # noqa: E402

RUNS = {  # name: (config, the cross-entropy run it starts from, baseline)
    "ce_soft": ("shapes_soft.yaml", None, None),
    "ce_hard": ("shapes_hard.yaml", None, None),
    "scst_soft_greedy": ("scst_shapes_soft.yaml", "ce_soft", "greedy"),
    "scst_soft_mean": ("scst_shapes_soft.yaml", "ce_soft", "mean"),
    "scst_hard_greedy": ("scst_shapes_hard.yaml", "ce_hard", "greedy"),
    "scst_hard_mean": ("scst_shapes_hard.yaml", "ce_hard", "mean"),
}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTIONING = os.path.join(os.path.dirname(sys.executable), "captioning")


def best_checkpoint(run_dir: str) -> str:
    found = sorted(
        glob.glob(os.path.join(run_dir, "lightning_logs", "version_*", "checkpoints", "best-*.ckpt")),
        key=os.path.getmtime,
    )
    if not found:
        raise SystemExit(f"no best-*.ckpt under {run_dir}")
    return found[-1]


def steps_of(path: str) -> int:
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def steps_logged(run_dir: str) -> int:
    """The steps the run reached: the last training step in its metrics.csv (logged every step).
    (last.ckpt does not tell: Lightning 2.6 rewrites it only when the best checkpoint changes.)"""
    import csv

    [path] = glob.glob(os.path.join(run_dir, "lightning_logs", "version_*", "metrics.csv"))[-1:]
    with open(path) as f:
        return max(int(r["step"]) + 1 for r in csv.DictReader(f) if r.get("train/loss"))


def bad_ending_rate(results_path: str) -> float:
    with open(results_path) as f:
        captions = [tokenize(r["caption"]) for r in json.load(f)]
    return sum(1 for w in captions if w and w[-1] in BAD_ENDINGS) / max(len(captions), 1)


def run(name: str, args) -> dict:
    config, start_from, baseline = RUNS[name]
    run_dir = os.path.join(args.out, name)
    command = [
        CAPTIONING,
        "fit",
        "--config",
        os.path.join(ROOT, "configs", config),
        "--data.annotations",
        args.data,
        "--trainer.accelerator",
        "cpu",
        "--trainer.default_root_dir",
        run_dir,
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        run_dir,
    ]
    if start_from:
        ce = args.ce_soft if start_from == "ce_soft" and args.ce_soft else None
        ce = ce or (args.ce_hard if start_from == "ce_hard" and args.ce_hard else None)
        ce = ce or best_checkpoint(os.path.join(args.out, start_from))
        command += ["--model.init_from", ce, "--model.objective.init_args.baseline", baseline]
    command += args.extra
    os.makedirs(run_dir, exist_ok=True)
    print(" ".join(command), flush=True)
    t0 = time.perf_counter()
    with open(os.path.join(run_dir, "fit.log"), "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
    fit_seconds = time.perf_counter() - t0
    best = best_checkpoint(run_dir)
    metrics, results = os.path.join(run_dir, "metrics.json"), os.path.join(run_dir, "results.json")
    evaluate = [
        CAPTIONING,
        "evaluate",
        "--checkpoint",
        best,
        "--annotations",
        args.data,
        "--split",
        "test",
        "--num-beams",
        "3",
        "--device",
        "cpu",
        "--out",
        metrics,
        "--results",
        results,
    ]
    print(" ".join(evaluate), flush=True)
    subprocess.run(evaluate, check=True, stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        scores = json.load(f)["scores"]
    report = {
        "name": name,
        "command": " ".join(command),
        "fit_seconds": round(fit_seconds, 1),
        "steps": steps_logged(run_dir),
        "best_checkpoint": best,
        "best_steps": steps_of(best),
        "start_from": command[command.index("--model.init_from") + 1] if start_from else None,
        "evaluate": " ".join(evaluate),
        "scores": scores,
        "bad_ending_rate": bad_ending_rate(results),
    }
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(
        json.dumps({k: report[k] for k in ("name", "fit_seconds", "steps", "best_steps", "bad_ending_rate")}),
        flush=True,
    )
    return report


def adopt(name: str, checkpoint: str, args) -> dict:
    """Evaluate a cross-entropy checkpoint trained elsewhere (e.g. the demo's) as run ``name``."""
    run_dir = os.path.join(args.out, name)
    os.makedirs(run_dir, exist_ok=True)
    metrics, results = os.path.join(run_dir, "metrics.json"), os.path.join(run_dir, "results.json")
    evaluate = [
        CAPTIONING,
        "evaluate",
        "--checkpoint",
        checkpoint,
        "--annotations",
        args.data,
        "--split",
        "test",
        "--num-beams",
        "3",
        "--device",
        "cpu",
        "--out",
        metrics,
        "--results",
        results,
    ]
    subprocess.run(evaluate, check=True, stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        scores = json.load(f)["scores"]
    report = {
        "name": name,
        "command": args.note or "(trained elsewhere)",
        "fit_seconds": args.fit_seconds,
        "steps": steps_of(checkpoint),
        "best_checkpoint": checkpoint,
        "best_steps": steps_of(checkpoint),
        "evaluate": " ".join(evaluate),
        "scores": scores,
        "bad_ending_rate": bad_ending_rate(results),
    }
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: report[k] for k in ("name", "steps", "bad_ending_rate")}), flush=True)
    return report


def table(out: str) -> str:
    lines = [
        "| attention | training | BLEU-4 | METEOR | CIDEr | object F1 | bad endings | training time (steps) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in RUNS:
        path = os.path.join(out, name, "run.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            r = json.load(f)
        s = r["scores"]
        kind = name.split("_")[1]
        what = {"ce": "cross-entropy", "scst": f"+ SCST ({name.split('_')[-1]} baseline)"}[name.split("_")[0]]
        meteor = s.get("METEOR")
        lines.append(
            f"| {kind} | {what} | {s['BLEU-4']:.3f} | {meteor if not isinstance(meteor, float) else f'{meteor:.3f}'} | "
            f"{s['CIDEr']:.3f} | {s.get('object_f1', float('nan')):.3f} | {r['bad_ending_rate']:.3f} | "
            f"{(r['fit_seconds'] or 0) / 60:.1f} min ({r['steps']:,} steps, best at {r['best_steps']:,}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="the shapes annotation file (dataset_shapes.json)")
    p.add_argument("--out", required=True, help="a folder for the runs")
    p.add_argument(
        "--ce-soft", help="a soft cross-entropy checkpoint to start from instead of the ce_soft run's (e.g. the demo's)"
    )
    p.add_argument("--ce-hard", help="the same for hard attention")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `captioning fit` arguments (last)")
    p.add_argument("--checkpoint", help="adopt: the checkpoint to evaluate as the run")
    p.add_argument("--note", help="adopt: how it was trained")
    p.add_argument("--fit-seconds", type=float, help="adopt: its training time")
    p.add_argument("what", choices=["run", "adopt", "table"])
    p.add_argument("names", nargs="*", help=", ".join(RUNS))
    args = p.parse_args(argv)
    if any(n not in RUNS for n in args.names):
        p.error(f"runs: {', '.join(RUNS)}")
    if args.what == "table":
        print(table(args.out))
        return 0
    if not args.data:
        p.error("run needs --data")
    if args.what == "adopt":
        adopt(args.names[0], args.checkpoint, args)
        return 0
    for name in args.names:
        run(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
