"""The tables of docs/studies/TRANSFORMER.md from finished runs: each row's seeds, their test scores
and their validation object F1 at equal CPU seconds.

    python -m tools.studies.transformer_study --runs-dir RUNS --speed speed_demo.json --budget-steps 1500 \\
        --row soft=en_words_s0,en_words_s1 --row T2=demo_T2_s0,demo_T2_s1 ...

A run is RUNS/NAME: ``test_last.json`` (``captioning evaluate --num-beams 3 --grounding`` of
last.ckpt on the test split) and lightning_logs (validation object F1, greedy, at every epoch's
end). ``--speed`` (optional: without it, the test scores and curves alone): the JSON of ``python -m tools.studies.transformer_speed --models --out``, whose
rows are named as the ``--row`` labels (soft, soft_aoa, hard, hard_aoa, T2, T2_aoa, T3, T3_aoa);
its first row is the reference whose ``--budget-steps`` set the CPU-second budget.

Equal CPU seconds: the learning rate is constant after the warm-up and the weight average starts
at step 500 in every config of the study, so a run stopped at step N is a run of N steps; a row
gets budget x (reference step time / its step time) steps, and its validation object F1 there is
read from the curve, linearly interpolated between the two validations around it. A row whose
budget lies past its run's end is marked ">=" with the run's last validation.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


def test_scores(run_dir: str) -> dict | None:
    """object F1, CIDEr, attention correctness and pointing game of a run's test_last.json (None: missing)."""
    path = os.path.join(run_dir, "test_last.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        scores = json.load(f)["scores"]
    grounding = scores.get("grounding") or {}
    return {
        "object_f1": scores.get("object_f1"),
        "CIDEr": scores.get("CIDEr"),
        "attention_correctness": grounding.get("attention_correctness"),
        "pointing_game": grounding.get("pointing_game"),
    }


def val_curve(run_dir: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps done, validation object F1) of a run; the logged step is the step count less one."""
    from tools.studies.hard_attention_study import run_scalars

    curve = run_scalars(run_dir).get("val/object_f1")
    if curve is None or not len(curve[0]):
        return None
    return curve[0] + 1, curve[1]


def value_at(curve, step: float) -> tuple[float, bool]:
    """(validation object F1 at ``step``, whether the step lies within the curve) by linear interpolation."""
    steps, values = curve
    if step > steps[-1]:
        return float(values[-1]), False
    return float(np.interp(step, steps, values)), True


def fmt(values, digits=3) -> str:
    """ "mean (s0 / s1 ...)" of the numbers present, "n/a" for none."""
    present = [v for v in values if v is not None]
    if not present:
        return "n/a"
    seeds = " / ".join("n/a" if v is None else f"{v:.{digits}f}" for v in values)
    return f"{np.mean(present):.{digits}f} ({seeds})" if len(values) > 1 else f"{present[0]:.{digits}f}"


def table(args) -> str:
    speed = {}
    if args.speed:
        with open(args.speed) as f:
            speed = json.load(f)["rows"]
    reference = next(iter(speed)) if speed else None
    head = "| row | runs | object F1 | CIDEr | attention correctness | pointing game | val object F1, last validation |"
    if speed:
        head += (
            " training step ms (x) | beam-3 images/s (x) | parameters | steps in the CPU time of "
            f"{reference}'s {args.budget_steps:,} | val object F1 there |"
        )
    lines = [head, "|" + "---|" * head.count(" |")]
    for spec in args.row:
        label, names = spec.split("=", 1)
        runs = names.split(",")
        scores = [test_scores(os.path.join(args.runs_dir, r)) or {} for r in runs]
        # a run counts once it has finished (its test_last.json written): a running one's curve is partial
        curves = [val_curve(os.path.join(args.runs_dir, r)) if score else None for r, score in zip(runs, scores)]
        cols = [
            fmt([s.get(k) for s in scores], 2 if k == "CIDEr" else 3)
            for k in ("object_f1", "CIDEr", "attention_correctness", "pointing_game")
        ]
        last = [None if c is None else float(c[1][-1]) for c in curves]
        last_steps = sorted({int(c[0][-1]) for c in curves if c is not None})
        cols.append(fmt(last) + (f" at {', '.join(map(str, last_steps))}" if last_steps else ""))
        x = speed.get(label)
        if not speed:
            pass
        elif x is None:
            cols += ["n/a", "n/a", "n/a", "n/a", "n/a"]
        else:
            steps = args.budget_steps * speed[reference]["train_ms_cpu"] / x["train_ms_cpu"]
            at = [None if c is None else value_at(c, steps) for c in curves]
            within = all(a[1] for a in at if a is not None)
            cols += [
                f"{x['train_ms_cpu']:.0f} ({x['train_ratio']:.2f})",
                f"{x['beam3_images_per_s_cpu']:.0f} ({x['beam3_ratio']:.2f})",
                f"{x['parameters'] / 1e6:.2f} M",
                f"{steps:,.0f}",
                ("" if within else ">= ") + fmt([None if a is None else a[0] for a in at]),
            ]
        lines.append(f"| {label} | {', '.join(runs)} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", default="runs", help="the folder holding the runs")
    p.add_argument("--row", action="append", required=True, help="LABEL=RUN[,RUN...]: a row and its seeds' runs")
    p.add_argument("--speed", help="transformer_speed --models --out JSON (rows named as the labels)")
    p.add_argument(
        "--budget-steps", type=int, default=1500, help="the reference row's steps (1,500 demo, 2,000 harder)"
    )
    args = p.parse_args(argv)
    print(table(args))


if __name__ == "__main__":
    main()
