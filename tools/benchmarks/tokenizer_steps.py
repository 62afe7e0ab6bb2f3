"""The training step's time with each tokenizer, alternating in one process (issue 41).

    OMP_NUM_THREADS=1 python -m tools.benchmarks.tokenizer_steps --annotations outputs/demo/data/dataset_shapes.json
    OMP_NUM_THREADS=1 python -m tools.benchmarks.tokenizer_steps --annotations DATA --rounds 12 --steps 5 --out steps.json

Each tokenizer gets the demo config's data (configs/shapes_soft.yaml: 96 (image, caption) pairs
a step, 64 px images decoded into the in-memory cache before timing, as after the demo's first
epoch) split by it, and the config's model (small CNN, soft attention, label smoothing, Adam at the
config's rate, gradients clipped at 5) for its vocabulary; ``--tokenizers`` lists them as
``name[:vocab_size[:max_length]]`` (default: ``words`` and ``bpe:100:50``, the figures of
docs/LANGUAGES.md). A step is Lightning's without its bookkeeping: the next batch of the training
loader, the images encoded, the objective, backward, clipping, Adam.

The tokenizers are timed round-robin (``--rounds`` rounds of ``--steps`` steps each, after a
warm-up step), so that a busy machine slows them all alike. Each row: the vocabulary's size, the
mean caption length in tokens, the median wall and CPU milliseconds a step, ``ratio`` and
``cpu_ratio`` (the row's median over the first row's), and ``paired_ratio`` / ``paired_cpu_ratio``
(each round's time over the first row's in that round: [median, lower quartile, upper quartile]).
Report the load average (printed) beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def config(path: str) -> dict:
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def parse_tokenizer(text: str) -> tuple[str, int | None, int | None]:
    """``bpe:100:50`` -> ("bpe", 100, 50); ``words`` -> ("words", None, None)."""
    name, *rest = text.split(":")
    numbers = [int(x) if x else None for x in rest] + [None, None]
    return name, numbers[0], numbers[1]


class Run:
    """One tokenizer's data, model, objective and optimizer, stepped on demand."""

    def __init__(self, spec: str, annotations: str, cfg: dict, seed: int):
        from captioning.data.captions import CaptionData
        from captioning.models.decoder import DecoderConfig
        from captioning.models.encoders import EncoderConfig
        from captioning.models.show_attend_tell import ShowAttendTell
        from captioning.objectives import objective_from_spec

        name, vocab_size, max_length = parse_tokenizer(spec)
        data_cfg = dict(cfg["data"])
        data_cfg.pop("annotations", None)
        if max_length is not None:
            data_cfg["max_length"] = max_length
        self.label = spec
        self.data = CaptionData(annotations, **data_cfg, tokenizer=name, vocab_size=vocab_size)
        self.data.setup("fit")
        model_cfg = cfg["model"]
        torch.manual_seed(seed)
        self.model = ShowAttendTell(
            EncoderConfig(**model_cfg["encoder"], pretrained=False),
            DecoderConfig(**model_cfg["decoder"]),
            self.data.vocab,
        )
        self.objective = objective_from_spec(model_cfg["objective"])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=model_cfg["optimizer"]["lr"])
        self.clip = cfg["trainer"].get("gradient_clip_val")
        self.loader = self.data.train_dataloader()
        self.batches = iter(self.loader)
        self.tokens = [len(t) for r in self.data.records("train") for t in r.tokens]
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def next_batch(self) -> dict:
        try:
            return next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            return next(self.batches)

    def step(self) -> None:
        self.model.train()
        batch = self.next_batch()
        self.optimizer.zero_grad(set_to_none=True)
        out = self.objective(self.model, self.model.features(batch), batch)
        out.loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.objective.commit(out)

    def timed(self, steps: int) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.step()
        self.wall.append((time.perf_counter() - wall) / steps)
        self.cpu.append((time.process_time() - cpu) / steps)


def spread(values: list[float]) -> list[float]:
    """[median, lower quartile, upper quartile] of ``values``, rounded."""
    if len(values) < 2:
        return [round(values[0], 3)] * 3 if values else []
    q = statistics.quantiles(values, n=4)
    return [round(statistics.median(values), 3), round(q[0], 3), round(q[2], 3)]


def main(argv=None) -> int:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--annotations", required=True, help="the demo's shapes data (dataset_shapes.json)")
    p.add_argument("--config", default=os.path.join(root, "configs", "shapes_soft.yaml"))
    p.add_argument("--tokenizers", default="words,bpe:100:50", help="name[:vocab_size[:max_length]], comma-separated")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds (each tokenizer once a round)")
    p.add_argument("--steps", type=int, default=5, help="training steps a round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)

    cfg = config(args.config)
    runs = [Run(spec, args.annotations, cfg, args.seed) for spec in args.tokenizers.split(",") if spec]
    for run in runs:  # warm-up: every image decoded into the cache (as after the demo's first epoch)
        dataset = run.loader.dataset
        if cfg["data"].get("cache_images"):
            for i in range(len(dataset)):
                dataset[i]
        run.step()
        run.wall.clear(), run.cpu.clear()
    for _ in range(args.rounds):
        for run in runs:
            run.timed(args.steps)
    rows, base, cpu_base = [], None, None
    for run in runs:
        wall, cpu = statistics.median(run.wall), statistics.median(run.cpu)
        base, cpu_base = base or wall, cpu_base or cpu
        rows.append(
            {
                "tokenizer": run.label,
                "vocabulary": len(run.data.vocab),
                "tokens_per_caption": round(statistics.mean(run.tokens), 2),
                "ms_per_step": round(wall * 1e3, 1),
                "cpu_ms_per_step": round(cpu * 1e3, 1),
                "ratio": round(wall / base, 3),
                "cpu_ratio": round(cpu / cpu_base, 3),
                # each round's ratio to the first tokenizer's in the same round: median and quartiles
                "paired_ratio": spread([w / b for w, b in zip(run.wall, runs[0].wall)]),
                "paired_cpu_ratio": spread([c / b for c, b in zip(run.cpu, runs[0].cpu)]),
            }
        )
    load = os.getloadavg()
    print(
        f"{args.rounds} rounds x {args.steps} steps, alternating; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}")
    for row in rows:
        print(
            f"  {row['tokenizer']:<12} vocab {row['vocabulary']:>4}  {row['tokens_per_caption']:5.2f} tokens/caption  "
            f"{row['ms_per_step']:7.1f} ms/step (CPU {row['cpu_ms_per_step']:.1f})"
        )
        paired, cpu = row["paired_ratio"], row["paired_cpu_ratio"]
        print(
            f"  {'':<12} ratio {row['ratio']:.3f} (CPU {row['cpu_ratio']:.3f}); paired by round: "
            f"{paired[0]:.3f} ({paired[1]:.3f}-{paired[2]:.3f}), CPU {cpu[0]:.3f} ({cpu[1]:.3f}-{cpu[2]:.3f})"
        )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "load_average": load, "rounds": args.rounds, "steps": args.steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
