"""Training step time and beam-search images/s of the LSTM and the Transformer decoder, in one
process, the kinds timed in alternation (so that a busy machine slows them alike; compare ratios).

    python -m tools.studies.transformer_speed                  # the shapes configs' decoders on features
    python -m tools.studies.transformer_speed --coco           # COCO's sizes: V=10,000, 14x14x2048, beam 5
    python -m tools.studies.transformer_speed --models --data DATA/dataset_shapes.json \
        [--hard-config configs/shapes_hard.yaml] [--hard-args "FLAGS"] [--rows soft soft_aoa hard hard_aoa T2 T2_aoa T3 T3_aoa] \
        [--budget-steps 1500] [--out speed.json]               # whole models, as `captioning fit` builds them

The first two time decoders only, on random annotation vectors (the encoder is the same for both
kinds): a training step is the teacher-forced pass, the cross-entropy and its backward and an Adam
step, on captions of ``--length`` tokens; decoding is beam search of ``--max-new-tokens`` steps (no
early stop: the captions of an untrained model do not end, so every step is timed).

``--models`` times every row of docs/studies/TRANSFORMER.md as its config builds it (the study's
rows: :data:`ROWS`): a training step is the whole step of `captioning fit` on the data's training
batches (encoder, decoder, the config's objective, backward, clipping at 5, Adam, the objective's
running state; not the weight average's update, the same few element-wise passes over the weights
for every row), and decoding is the config's test decoding at 3 beams of ``--images`` validation
images, encoder included, every caption held to ``--max-new-tokens`` steps (untrained models).
Times are the process's CPU time (one thread: the CPU seconds a step costs) and wall time;
``--budget-steps N``: each row's steps in the CPU seconds of soft's N steps (the equal-CPU-seconds
budget of the study).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import time

import torch
import torch.nn.functional as F

from captioning.decoding.generation import GenerationConfig
from captioning.decoding.search import generate
from captioning.models.decoder import DecoderConfig
from captioning.models.kinds import build_decoder
from captioning.models.transformer import TransformerConfig

SHAPES = {
    "lstm": DecoderConfig(embed_dim=128, hidden_dim=256, attention_dim=128, dropout=0.1),
    "transformer2": TransformerConfig(hidden_dim=128, heads=4, layers=2, dropout=0.1),
    "transformer3": TransformerConfig(hidden_dim=128, heads=4, layers=3, dropout=0.1),
}
COCO = {
    "lstm": DecoderConfig(),  # the paper's: 512 / 512 / 512
    "transformer3": TransformerConfig(heads=8, layers=3, dropout=0.1),
    "transformer6": TransformerConfig(heads=8, layers=6, dropout=0.1),
}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AOA = ["--model.decoder.aoa", "true"]
#: the study's rows: name -> (config, overrides); "HARD" is replaced by ``--hard-config``
ROWS = {
    "soft": ("configs/shapes_soft.yaml", []),
    "soft_aoa": ("configs/shapes_soft.yaml", AOA),
    "hard": ("HARD", []),
    "hard_aoa": ("HARD", AOA),
    "T2": ("configs/shapes_transformer.yaml", []),
    "T2_aoa": ("configs/shapes_transformer.yaml", AOA),
    "T3": ("configs/shapes_transformer.yaml", ["--model.decoder.layers", "3"]),
    "T3_aoa": ("configs/shapes_transformer.yaml", ["--model.decoder.layers", "3", *AOA]),
}


def build_row(config: str, overrides: list[str], data: str):
    """(module, datamodule) of a config as `captioning fit` builds them, the data set up."""
    from captioning.training.cli import run_lightning_cli

    path = config if os.path.isabs(config) else os.path.join(ROOT, config)
    args = ["--config", path, "--data.annotations", data, "--data.num_workers", "0", "--trainer.accelerator", "cpu"]
    cli = run_lightning_cli(args + overrides + ["--trainer.logger", "false", "--trainer.max_steps", "1"], run=False)
    module, dm = cli.model, cli.datamodule
    dm.setup("fit")
    module.set_vocab(dm.vocab)
    return module, dm


def time_models(args) -> dict:
    """The --models table: every row's whole training step and its beam-3 decoding, alternating."""
    from captioning.training.optim import build_optimizer

    torch.manual_seed(0)
    rows = {}
    for name in args.rows:
        config, overrides = ROWS[name]
        if config == "HARD":
            config, overrides = args.hard_config, shlex.split(args.hard_args) + overrides
        module, dm = build_row(config, overrides, args.data)
        images = next(iter(dm.val_dataloader()))["images"][: args.images]
        gen = dataclasses.replace(
            module.test_generation,
            num_beams=3,
            max_new_tokens=args.max_new_tokens,
            min_new_tokens=args.max_new_tokens - 1,
        )
        optimizer = build_optimizer(module.model, module.optimizer_config, False)
        rows[name] = dict(module=module, batches=iter(dm.train_dataloader()), images=images, gen=gen, opt=optimizer)
        rows[name].update(train_cpu=[], train_wall=[], decode_cpu=[], decode_wall=[])

    def train_step(row):
        module, opt = row["module"], row["opt"]
        module.train()
        batch = next(row["batches"])
        c0, t0 = time.process_time(), time.perf_counter()
        out = module.objective(module.model, module.model.features(batch), batch)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(module.model.parameters(), 5.0)
        opt.step()
        module.objective.commit(out)
        return time.process_time() - c0, time.perf_counter() - t0

    def decode(row):
        model = row["module"].model.eval()
        c0, t0 = time.process_time(), time.perf_counter()
        with torch.no_grad():
            generate(model.decoder, model.encoder(row["images"]), row["gen"])
        return time.process_time() - c0, time.perf_counter() - t0

    for r in range(args.rounds + 1):  # round 0 warms up (and fills the image caches)
        for row in rows.values():  # alternating: a busy machine slows each alike
            for _ in range(args.steps):
                cpu, wall = train_step(row)
                if r:
                    row["train_cpu"].append(cpu), row["train_wall"].append(wall)
            cpu, wall = decode(row)
            if r:
                row["decode_cpu"].append(cpu), row["decode_wall"].append(wall)

    def median(x):
        return sorted(x)[len(x) // 2]

    result, base = {}, None
    for name, row in rows.items():
        model = row["module"].model
        step, step_wall = median(row["train_cpu"]), median(row["train_wall"])
        n = len(row["images"])
        speed, speed_wall = n / median(row["decode_cpu"]), n / median(row["decode_wall"])
        base = base or (step, speed)
        result[name] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "decoder_parameters": sum(p.numel() for p in model.decoder.parameters()),
            "train_ms_cpu": 1000 * step,
            "train_ms_wall": 1000 * step_wall,
            "train_ratio": step / base[0],
            "beam3_images_per_s_cpu": speed,
            "beam3_images_per_s_wall": speed_wall,
            "beam3_ratio": speed / base[1],
            "steps_timed": len(row["train_cpu"]),
        }
        if args.budget_steps:
            result[name]["equal_cpu_steps"] = round(args.budget_steps / result[name]["train_ratio"])
    first = next(iter(rows))
    print(
        f"{args.data}: {args.rounds} rounds x {args.steps} training steps, {len(rows[first]['images'])} images at beam 3 "
        f"x {args.max_new_tokens} steps; {torch.get_num_threads()} thread(s); CPU time (wall) medians; x {first}"
    )
    budget = f" | steps in {first}'s {args.budget_steps} |" if args.budget_steps else " |"
    print("| row | parameters (decoder) | training step ms | x | beam-3 images/s | x" + budget)
    print("|---|---|---|---|---|---|" + ("---|" if args.budget_steps else ""))
    for name, x in result.items():
        extra = f" {x['equal_cpu_steps']:,} |" if args.budget_steps else ""
        print(
            f"| {name} | {x['parameters'] / 1e6:.2f} M ({x['decoder_parameters'] / 1e6:.2f} M) | "
            f"{x['train_ms_cpu']:.0f} ({x['train_ms_wall']:.0f}) | {x['train_ratio']:.2f} | "
            f"{x['beam3_images_per_s_cpu']:.1f} ({x['beam3_images_per_s_wall']:.1f}) | {x['beam3_ratio']:.2f} |" + extra
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"data": args.data, "hard_config": args.hard_config, "hard_args": args.hard_args, "rows": result},
                f,
                indent=1,
            )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coco", action="store_true", help="COCO's sizes (V=10,000, 14x14x2048, beam 5)")
    p.add_argument("--models", action="store_true", help="whole models of the study's rows, from their configs")
    p.add_argument("--data", help="--models: the annotations (DATA/dataset_shapes.json)")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS), help="--models: the rows to time")
    p.add_argument("--hard-config", default="configs/shapes_hard.yaml", help="--models: the hard rows' config")
    p.add_argument("--hard-args", default="", help="--models: flags added to the hard rows' config (one string)")
    p.add_argument("--rounds", type=int, default=4, help="--models: timed rounds (after one warm-up round)")
    p.add_argument("--steps", type=int, default=3, help="--models: training steps of each row per round")
    p.add_argument(
        "--budget-steps", type=int, default=None, help="--models: the first row's steps to match in CPU time"
    )
    p.add_argument("--out", help="--models: write the figures as JSON")
    p.add_argument("--batch", type=int, default=None, help="captions per training step (default 96; COCO 32)")
    p.add_argument("--images", type=int, default=None, help="images per beam search (default 96; COCO 8)")
    p.add_argument("--length", type=int, default=None, help="tokens per caption (default 14; COCO 18)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="decoding steps (default 14; COCO 18)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of each (after one warm-up)")
    args = p.parse_args()
    if args.models:
        if not args.data:
            p.error("--models needs --data DATA/dataset_shapes.json")
        args.images = args.images or 96
        args.max_new_tokens = args.max_new_tokens or 14
        time_models(args)
        return
    torch.manual_seed(0)
    if args.coco:
        configs, V, L, D, beams = COCO, 10_000, 196, 2048, 5
        batch, images, length, steps = args.batch or 32, args.images or 8, args.length or 18, args.max_new_tokens or 18
    else:
        configs, V, L, D, beams = SHAPES, 30, 64, 256, 3
        batch, images, length, steps = args.batch or 96, args.images or 96, args.length or 14, args.max_new_tokens or 14
    decoders = {name: build_decoder(V, D, c) for name, c in configs.items()}
    features = torch.randn(batch, L, D)
    captions = torch.randint(4, V, (batch, length + 1))
    captions[:, 0] = 1
    lengths = torch.full((batch,), length + 1)
    decode_features = torch.randn(images, L, D)
    gen = GenerationConfig(num_beams=beams, max_new_tokens=steps, min_new_tokens=steps - 1)
    optimizers = {name: torch.optim.Adam(d.parameters(), lr=1e-4) for name, d in decoders.items()}

    def train_step(name):
        dec = decoders[name].train()
        out = dec(features, captions, lengths)
        loss = F.cross_entropy(out.step_logits, captions[:, 1:][out.mask])
        optimizers[name].zero_grad()
        loss.backward()
        optimizers[name].step()

    def decode(name):
        with torch.no_grad():
            generate(decoders[name].eval(), decode_features, gen)

    times = {(name, what): [] for name in decoders for what in ("train", "decode")}
    for repeat in range(args.repeats + 1):
        for name in decoders:  # alternating: a busy machine slows each alike
            for what, fn in (("train", train_step), ("decode", decode)):
                t0 = time.perf_counter()
                fn(name)
                if repeat:  # the first is a warm-up
                    times[(name, what)].append(time.perf_counter() - t0)
    print(
        f"V={V} L={L} D={D}; training: {batch} captions of {length} tokens; "
        f"beam {beams}: {images} images x {steps} steps; {torch.get_num_threads()} thread(s); median of {args.repeats}"
    )
    base = None
    print("| decoder | parameters | training step ms | x LSTM | beam images/s | x LSTM |")
    print("|---|---|---|---|---|---|")
    for name, dec in decoders.items():
        step = sorted(times[(name, "train")])[args.repeats // 2]
        speed = images / sorted(times[(name, "decode")])[args.repeats // 2]
        base = base or (step, speed)
        params = sum(p.numel() for p in dec.parameters())
        print(
            f"| {name} | {params / 1e6:.2f} M | {step * 1000:.0f} | {step / base[0]:.2f} | {speed:.1f} | {speed / base[1]:.2f} |"
        )


if __name__ == "__main__":
    main()
