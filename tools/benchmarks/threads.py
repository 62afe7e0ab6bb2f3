"""Training steps per second of the demo's config, alone and beside busy programs, with PyTorch's
default threads and with the threads chosen from the free cores (common.py: ``choose_threads``).

    python -m tools.benchmarks.threads [--steps 40] [--warmup 5] [--busy 0,1,2] [--out threads.json]

It makes a small shapes dataset (the demo's images and captions, fewer of them), then for each
number of busy programs (``--busy``: each a Python process spinning on one core, started and
stopped here) trains ``--steps`` steps of configs/shapes_soft.yaml in a fresh process twice: with
``--threads`` set to every core (PyTorch's default) and with the threads left to the choice from
the free cores (ThreadWatch, as ``captioning fit`` and the demo run). The steps after ``--warmup``
are timed (no validation, no checkpoints). Other work on the machine adds to the busy programs:
the table shows what the machine's other processes used while each run ran, and the threads each
run ended with. docs/PERFORMANCE.md ("Threads") has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPIN = "while True: pass"


def child(annotations: str, steps: int, warmup: int, threads: int | None) -> dict:
    """In a fresh process: ``steps`` training steps of the demo's config; the steps per second of
    those after ``warmup``, and the threads at the end."""
    import torch
    from lightning.pytorch.callbacks import Callback

    from captioning.common import CpuSample, usable_cores
    from captioning.training.cli import run_lightning_cli

    class StepTimer(Callback):
        def __init__(self):
            self.times: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.times.append(time.perf_counter())

    args = [
        "--config",
        str(ROOT / "configs" / "shapes_soft.yaml"),
        "--data.annotations",
        annotations,
        "--trainer.max_steps",
        str(steps),
        "--trainer.limit_val_batches",
        "0",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.accelerator",
        "cpu",
    ]
    if threads is not None:
        args += ["--threads", str(threads)]
    cli = run_lightning_cli(args, run=False)
    timer = StepTimer()
    cli.trainer.callbacks.append(timer)
    first = CpuSample()
    cli.trainer.fit(cli.model, cli.datamodule)
    others = CpuSample().others_busy(first, usable_cores())
    timed = timer.times[warmup:]
    rate = (len(timed) - 1) / (timed[-1] - timed[0]) if len(timed) > 1 else float("nan")
    return {"steps_per_s": rate, "threads": torch.get_num_threads(), "others_busy": others}


def run_child(annotations: str, steps: int, warmup: int, threads: int | None, workdir: str) -> dict:
    """``child`` in a fresh process whose working folder is ``workdir``: Lightning writes the run's
    config.yaml there (no logger, so no log folder), not into the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the choice is ours to make
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    code = (
        "import json, sys; from tools.benchmarks.threads import child; "
        f"print('RESULT', json.dumps(child({annotations!r}, {steps}, {warmup}, {threads!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=workdir)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the training run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="training steps of each run")
    p.add_argument("--warmup", type=int, default=5, help="the first steps, not timed")
    p.add_argument("--busy", default="0,1,2", help="numbers of busy programs to run beside, comma-separated")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    from captioning.common import usable_cores
    from captioning.data.shapes import generate

    cores = usable_cores()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        annotations = str(generate(Path(tmp) / "shapes", n_train=500, n_val=8, n_test=8, seed=0, progress=False))
        for busy in (int(b) for b in args.busy.split(",")):
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
            try:
                time.sleep(1.0)
                for mode, threads in (("default", cores), ("chosen", None)):
                    result = run_child(annotations, args.steps, args.warmup, threads, tmp)
                    rows.append({"busy": busy, "mode": mode, **result, "load": os.getloadavg()[0]})
                    r = rows[-1]
                    print(
                        f"busy {busy}  {mode:8s} threads {r['threads']}  {r['steps_per_s']:.2f} steps/s  "
                        f"(others used {r['others_busy']:.1f} of {cores} cores; load {r['load']:.1f})",
                        flush=True,
                    )
            finally:
                for s in spinners:
                    s.kill()
                    s.wait()
    print(f"\n{cores} cores; configs/shapes_soft.yaml, {args.steps} steps ({args.warmup} untimed), no validation\n")
    print("| busy programs beside | default threads: steps/s | chosen threads | steps/s | chosen / default |")
    print("|---|---|---|---|---|")
    for busy in sorted({r["busy"] for r in rows}):
        d, c = (next(r for r in rows if r["busy"] == busy and r["mode"] == m) for m in ("default", "chosen"))
        ratio = c["steps_per_s"] / d["steps_per_s"] if d["steps_per_s"] else float("nan")
        print(
            f"| {busy} | {d['steps_per_s']:.2f} ({d['threads']}) | {c['threads']} | {c['steps_per_s']:.2f} | {ratio:.2f}x |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"cores": cores, "steps": args.steps, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
