"""Minor page faults and time of the demo's CPU training step with glibc's malloc as it comes and with
the memory a step frees kept for the next step (captioning/training/allocator.py).

    python -m tools.benchmarks.allocator [--steps 9] [--warmup 2] [--rounds 2] [--decoder fast|plain] [--out FILE]

Each run is a fresh process (malloc's settings are made once per process, before the first
allocation that matters): the demo's small CNN and decoder (its fast twin, as training runs it, or
the plain model), 96 captions of 64-pixel images, forward and backward; ``--warmup`` steps first
(they fault the heap in either way), then ``--steps`` steps, each counted (ru_minflt) and timed
(process time). The two settings alternate over ``--rounds`` rounds, so that a busy machine slows
both alike; the table gives the median step of each run and their ratio. docs/RECIPES.md ("Where
the demo's time goes") has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the child: prints {"set": ..., "faults": [...], "ms": [...]} of the steps after the warm-up
CHILD = """
import json, resource, sys, time, torch
from captioning.training.allocator import keep_freed_memory
from captioning.models.decoder import DecoderConfig
from captioning.models.encoders import EncoderConfig
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.fast import fast_decoder
from captioning.vocab import Vocabulary
mode, steps, warmup, threads, which = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
done = keep_freed_memory() if mode == "keep" else None
torch.set_num_threads(threads)
torch.manual_seed(0)
vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(26)])
model = ShowAttendTell(EncoderConfig("small_cnn", channels=(16, 32, 64), dim=256, channels_last=True),
                       DecoderConfig(embed_dim=128, hidden_dim=256, attention_dim=128), vocab)
images = torch.rand(96, 3, 64, 64)
lengths = torch.randint(5, 27, (96,))
captions = torch.randint(4, len(vocab), (96, 27))
decoder = fast_decoder(model.decoder) if which == "fast" else model.decoder
def step():
    model.zero_grad(set_to_none=True)
    features = model.encoder(images)
    decoder(features, captions, lengths).logits.sum().backward()
for _ in range(warmup):
    step()
faults, ms = [], []
for _ in range(steps):
    f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    step()
    ms.append(1000 * (time.process_time() - t0))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"set": done, "faults": faults, "ms": ms}))
"""


def run(mode: str, steps: int, warmup: int, threads: int, decoder: str) -> dict:
    """One fresh process of ``mode`` ("plain": glibc's defaults, "keep": keep_freed_memory), without
    malloc settings of the environment (they would make keep_freed_memory leave malloc alone)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GLIBC_TUNABLES", "MALLOC_"))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(steps), str(warmup), str(threads), decoder],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=9, help="measured steps of each run")
    p.add_argument("--warmup", type=int, default=2, help="steps before them, not measured")
    p.add_argument("--rounds", type=int, default=2, help="runs of each setting, alternating")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    p.add_argument(
        "--decoder", choices=("fast", "plain"), default="fast", help="the twin training runs, or the plain model"
    )
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("allocator: glibc's malloc settings apply on Linux only", file=sys.stderr)
        return 1
    rows = []
    for round_ in range(args.rounds):
        for mode in ("plain", "keep"):
            result = run(mode, args.steps, args.warmup, args.threads, args.decoder)
            if mode == "keep" and result["set"] is not True:
                print("allocator: keep_freed_memory() did not set malloc's thresholds here", file=sys.stderr)
                return 1
            row = {
                "round": round_,
                "mode": mode,
                "faults_median": statistics.median(result["faults"]),
                "faults_min": min(result["faults"]),
                "faults_max": max(result["faults"]),
                "ms_median": round(statistics.median(result["ms"]), 1),
                **result,
            }
            rows.append(row)
            print(
                f"round {round_} {mode:5s}: {row['faults_median']:,.0f} faults a step (median; "
                f"{row['faults_min']:,}-{row['faults_max']:,}), {row['ms_median']:.1f} ms of process time",
                flush=True,
            )
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    print(
        f"\nthe demo's step (96 pairs, 64 px, the {args.decoder} decoder), {args.threads} thread(s), "
        f"{args.steps} steps a run; {machine}\n"
    )
    print("| round | plain: faults a step | kept: faults a step | plain: ms | kept: ms | kept / plain time |")
    print("|---|---|---|---|---|---|")
    for round_ in range(args.rounds):
        plain, keep = (next(r for r in rows if r["round"] == round_ and r["mode"] == m) for m in ("plain", "keep"))
        print(
            f"| {round_} | {plain['faults_median']:,.0f} | {keep['faults_median']:,.0f} | {plain['ms_median']:.1f} | "
            f"{keep['ms_median']:.1f} | {keep['ms_median'] / plain['ms_median']:.3f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"argv": sys.argv, "machine": machine, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
