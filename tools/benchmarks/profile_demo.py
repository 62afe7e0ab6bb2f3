"""Where the shapes demo's training time goes, on this machine: one epoch's steps and its validation.

    python -m tools.benchmarks.profile_demo --annotations outputs/demo/data/dataset_shapes.json
    python -m tools.benchmarks.profile_demo --annotations ... --threads 1 --config configs/shapes_soft.yaml --out profile.json

The demo's model and data settings are read from the config (``model.encoder``, ``model.decoder``,
``model.objective``, ``model.val_generation``, ``data``); each part is timed on its own, round-robin
over ``--rounds`` rounds so that a busy machine slows every part alike (compare the parts of one
run, not runs):

- ``load``: a training batch from the files (decode, resize, collate: what a loader worker does),
  and from the in-memory cache (``data.cache_images``) once it is filled;
- ``encoder``: the small CNN's forward and backward, contiguous and channels-last;
- ``decoder``: the objective's forward (decoder + loss, features given) and backward;
- ``adam``: the optimizer step (gradient clipping included);
- ``step_plain`` / ``step_bucketed``: a whole step (encoder, decoder, loss, backward, Adam) on
  randomly drawn batches and on length-bucketed ones (``data.bucket_by_length``);
- ``validation``: decoding the validation split as the config does (greedy) and scoring it with the
  pure-Python PTB tokens (training's validation), and the Java PTB tokenizer's start-up (the time
  a validation spent before it moved to Python tokens; skipped without ``java``).

It prints ms per step of each part and the share of an epoch (its steps and one validation) that
each takes, with the config's batch size and the data's epoch length.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import time
from pathlib import Path

import torch
import yaml

from captioning.data.captions import CaptionData  # noqa: E402
from captioning.decoding.generation import GenerationConfig  # noqa: E402
from captioning.evaluation.evaluator import Evaluator  # noqa: E402
from captioning.fast import fast_model  # noqa: E402
from captioning.models.decoder import DecoderConfig  # noqa: E402
from captioning.models.encoders import EncoderConfig  # noqa: E402
from captioning.models.spec import ModelSpec, build_model  # noqa: E402
from captioning.objectives import objective_for  # noqa: E402
from captioning.objectives.cross_entropy import CrossEntropy  # noqa: E402


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def java_start_seconds() -> float | None:
    """Seconds for the JVM of coco-caption's PTB tokenizer to tokenize one short caption, or None without java."""
    if shutil.which("java") is None:
        return None
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    t0 = time.perf_counter()
    PTBTokenizer().tokenize({0: [{"caption": "a red circle"}]})
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--annotations", required=True, help="the demo's dataset_shapes.json")
    parser.add_argument("--config", default=str(Path(__file__).resolve().parents[2] / "configs" / "shapes_soft.yaml"))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=6, help="batches timed per part and round")
    parser.add_argument("--out", help="write the figures here (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = yaml.safe_load(Path(args.config).read_text())
    model_cfg, data_cfg = config["model"], dict(config["data"])
    data_cfg.update(annotations=args.annotations, num_workers=0)
    data_cfg.pop("cache_images", None)
    data_cfg.pop("bucket_by_length", False)

    plain_data = CaptionData(**data_cfg)
    plain_data.setup()
    cached_data = CaptionData(**data_cfg, cache_images=True)
    cached_data.set_vocab(plain_data.vocab)
    bucketed_data = CaptionData(**{**data_cfg, "group_captions": False}, cache_images=True, bucket_by_length=True)
    bucketed_data.set_vocab(plain_data.vocab)

    encoder = EncoderConfig(**{**model_cfg["encoder"], "channels_last": False})
    decoder = DecoderConfig(**model_cfg["decoder"])
    image_size = data_cfg["image_size"]
    torch.manual_seed(0)
    model = build_model(ModelSpec(encoder, decoder, image_size, GenerationConfig()), plain_data.vocab)
    objective_args = model_cfg.get("objective", {}).get("init_args", {})
    objective = objective_for(decoder.attention_kind, CrossEntropy(**objective_args))
    fast = fast_model(model)  # what fit runs (captioning/fast/)
    optimizer = torch.optim.Adam(model.parameters(), lr=model_cfg.get("optimizer", {}).get("lr", 1e-3))
    clip = config.get("trainer", {}).get("gradient_clip_val")
    channels_last = build_model(
        ModelSpec(
            EncoderConfig(**{**model_cfg["encoder"], "channels_last": True}), decoder, image_size, GenerationConfig()
        ),
        plain_data.vocab,
    )
    channels_last.load_state_dict(model.state_dict())

    def batches(data, n):
        out = list(itertools.islice(iter(data.train_dataloader()), n))
        for b in out:
            b.pop("bad_images", None)
        return out

    train = batches(plain_data, args.batches)
    bucketed = batches(bucketed_data, args.batches)
    cached_loader = cached_data.train_dataloader()
    for _ in cached_loader:  # an epoch fills the cache (of this loader's dataset)
        pass
    plain_iter, cached_iter = iter(plain_data.train_dataloader()), iter(cached_loader)

    def encoder_pass(m, images):
        m.zero_grad(set_to_none=True)
        m.features({"images": images}).float().sum().backward()

    def decoder_pass(b, features):
        model.zero_grad(set_to_none=True)
        objective(fast, features, b).loss.backward()

    def whole_step(b):
        optimizer.zero_grad(set_to_none=True)
        objective(fast, model.features(b), b).loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    def adam_step():
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    val_generation = GenerationConfig(**model_cfg.get("val_generation", {}))
    evaluator = Evaluator(("BLEU", "CIDEr"), tokenizer="python")
    val_loader = cached_data.eval_dataloader("val")
    references = cached_data.references("val")

    def validation():
        evaluator.reset()
        model.eval()
        with torch.no_grad():
            for b in val_loader:
                b.pop("bad_images", None)
                evaluator.add(fast, b, val_generation)
        model.train()
        evaluator.score(evaluator.predictions(model.vocab), references)

    parts: dict[str, list[float]] = {}
    features = [model.features(b).detach() for b in train]
    for _ in range(args.rounds):
        runs = {
            "load_files": lambda: next(plain_iter),
            "load_cached": lambda: next(cached_iter),
            "encoder_contiguous": lambda: [encoder_pass(model, b["images"]) for b in train],
            "encoder_channels_last": lambda: [encoder_pass(channels_last, b["images"]) for b in train],
            "decoder": lambda: [decoder_pass(b, f) for b, f in zip(train, features)],
            "adam": lambda: [adam_step() for _ in train],
            "step_plain": lambda: [whole_step(b) for b in train],
            "step_bucketed": lambda: [whole_step(b) for b in bucketed],
        }
        for name, fn in runs.items():
            per = 1 if name.startswith("load") else len(train)
            parts.setdefault(name, []).append(timed(fn, args.batches if per == 1 else 1) / per)
        parts.setdefault("validation", []).append(timed(validation, 1))
    ms = {name: 1000 * statistics.median(v) for name, v in parts.items()}
    java = java_start_seconds()
    if java is not None:
        ms["java_ptb_start"] = 1000 * java

    epoch_steps = len(plain_data.train_dataloader())
    epoch_ms = epoch_steps * ms["step_plain"] + ms["validation"]
    report = {
        "config": args.config,
        "threads": args.threads,
        "batch_size": data_cfg["batch_size"],
        "epoch_steps": epoch_steps,
        "val_images": len(references),
        "ms": {k: round(v, 1) for k, v in ms.items()},
        "epoch_share": {
            "training steps": round(epoch_steps * ms["step_plain"] / epoch_ms, 3),
            "validation": round(ms["validation"] / epoch_ms, 3),
            "image loading (in the main process, uncached)": round(epoch_steps * ms["load_files"] / epoch_ms, 3),
        },
        "ratios": {
            "channels_last / contiguous encoder": round(ms["encoder_channels_last"] / ms["encoder_contiguous"], 3),
            "bucketed / plain step": round(ms["step_bucketed"] / ms["step_plain"], 3),
            "cached / file batch loading": round(ms["load_cached"] / ms["load_files"], 3),
            "encoder / step": round(ms["encoder_contiguous"] / ms["step_plain"], 3),
            "decoder / step": round(ms["decoder"] / ms["step_plain"], 3),
        },
    }
    print(
        f"{args.config}: batch {report['batch_size']}, {epoch_steps} steps an epoch, {len(references)} validation images, "
        f"{args.threads} thread(s)"
    )
    for name, value in report["ms"].items():
        print(f"  {name:24s} {value:9.1f} ms" + ("" if name in ("validation", "java_ptb_start") else " a step"))
    for name, value in {**report["epoch_share"], **report["ratios"]}.items():
        print(f"  {name}: {value}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
