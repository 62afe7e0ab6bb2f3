"""Exported models: folder sizes against the checkpoint, and ONNX Runtime against PyTorch captioning speed.

    python -m tools.benchmarks.export_benchmark --checkpoint DEMO.ckpt --annotations dataset_shapes.json --out bench_export.json
    python -m tools.benchmarks.export_benchmark --checkpoint DEMO.ckpt --annotations dataset_shapes.json --quick   # smoke run

Two models: the ``--checkpoint`` (the shapes demo's) and a ResNet-101 soft-attention model at
COCO's sizes (configs/coco_soft.yaml: 14x14x2048 grid at 224 px, 512-wide decoder, a vocabulary of
``--vocab-size`` words) with random weights (nothing is downloaded: its captions run to
max_new_tokens, the worst case, the same number of steps for both runtimes while they agree). Its
"checkpoint" is laid out as `captioning fit` writes one (weights, and Adam's two moments of the
trainable parameters: the decoder, the encoder being frozen), for its size.

Each model is exported to a safetensors folder and an ONNX folder (in a temporary folder); then the
same images (decoded once, beforehand) are captioned end to end -- preprocessing, encoder, search --
by ``Captioner`` (PyTorch) and ``OnnxCaptioner`` (onnxruntime + numpy), greedy and beam 3, in
batches of ``--batch-size``, with ``--threads`` threads each (torch.set_num_threads, onnxruntime's
intra-op threads). The runs are interleaved (PyTorch, ONNX, PyTorch, ...) ``--repeats`` times and
the median is reported, so that a load that changes during the run hits both alike. Also reported:
how many captions agree and the largest score difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: E402

from captioning.api import Captioner  # noqa: E402
from captioning.decoding.generation import GenerationConfig  # noqa: E402
from captioning.export.onnx import export_onnx  # noqa: E402
from captioning.export.onnx_captioner import OnnxCaptioner  # noqa: E402
from captioning.models.decoder import DecoderConfig  # noqa: E402
from captioning.models.encoders import EncoderConfig  # noqa: E402
from captioning.models.spec import ModelSpec, build_model  # noqa: E402
from captioning.storage.folder import folder_summary, save_folder  # noqa: E402
from captioning.storage.load import load_model  # noqa: E402
from captioning.vocab import Vocabulary  # noqa: E402


def resnet101_model(vocab_size: int, seed: int = 0):
    """configs/coco_soft.yaml's model with random weights and a vocabulary of ``vocab_size`` made-up words."""
    torch.manual_seed(seed)
    spec = ModelSpec(
        EncoderConfig("resnet101", pretrained=False, grid_size=14),
        DecoderConfig(embed_dim=512, hidden_dim=512, attention_dim=512, dropout=0.5, attention_kind="soft"),
        image_size=224,
        generation=GenerationConfig(num_beams=3, max_new_tokens=30),
    )
    model = build_model(spec, Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(vocab_size - 4)]))
    model.card = {}
    return model.eval()


def synthetic_checkpoint(model, path: Path) -> str:
    """A checkpoint laid out as `captioning fit` writes one (weights, hyperparameters, vocabulary and
    Adam's two moments of every trainable parameter after one step), for its size."""
    from captioning.training.optim import OptimizerConfig, build_optimizer

    optimizer = build_optimizer(model, OptimizerConfig(), False)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    spec = model.spec.to_dict()
    hparams = {
        "encoder": spec["encoder"],
        "decoder": spec["decoder"],
        "image_size": spec["image_size"],
        "test_generation": spec["generation"],
        "val_generation": dict(spec["generation"], num_beams=1),
        "objective": {"class_path": "captioning.objectives.CrossEntropy", "init_args": {}},
        "optimizer": {},
        "nonfinite_loss": "error",
    }
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "optimizer_states": [optimizer.state_dict()],
            "hyper_parameters": hparams,
            "vocabulary": model.vocab.to_dict(),
        },
        path,
    )
    return str(path)


def test_images(annotations: str, n: int) -> list:
    from captioning.data.formats import load_records
    from captioning.data.images import load_image

    root = Path(annotations).resolve().parent
    records = [r for r in load_records(annotations) if r.split == "test"][:n]
    return [load_image(root / r.path) for r in records]


def timed(fn) -> tuple[float, list]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_model(name: str, model, images: list, args, checkpoint: str | None, work: Path) -> list[dict]:
    folder = save_folder(work / f"{name}_safetensors", model, model.card)
    onnx_folder = export_onnx(model, work / f"{name}_onnx")
    sizes = {
        "checkpoint_mb": round(os.path.getsize(checkpoint) / 1e6, 2) if checkpoint else None,
        "safetensors_folder_mb": round(sum(folder_summary(folder).values()) / 1e6, 2),
        "onnx_folder_mb": round(sum(folder_summary(onnx_folder).values()) / 1e6, 2),
    }
    torch.set_num_threads(args.threads)
    pt = Captioner.from_pretrained(folder, device="cpu")
    ort = OnnxCaptioner(onnx_folder, num_threads=args.threads)
    rows = []
    for beams in (1, 3):
        times = {"pytorch": [], "onnx": []}
        outs = {}
        pt(images[: args.batch_size], num_beams=beams, batch_size=args.batch_size)  # warm-up: allocators, caches
        ort(images[: args.batch_size], num_beams=beams, batch_size=args.batch_size)
        for _ in range(args.repeats):
            for runtime, captioner in (("pytorch", pt), ("onnx", ort)):
                seconds, outs[runtime] = timed(lambda: captioner(images, num_beams=beams, batch_size=args.batch_size))
                times[runtime].append(seconds)
        same = sum(a["generated_text"] == b["generated_text"] for a, b in zip(outs["pytorch"], outs["onnx"]))
        score_diff = max(abs(a["score"] - b["score"]) for a, b in zip(outs["pytorch"], outs["onnx"]))
        pt_ips, ort_ips = (
            len(images) / statistics.median(times["pytorch"]),
            len(images) / statistics.median(times["onnx"]),
        )
        rows.append(
            {
                "model": name,
                "num_beams": beams,
                "images": len(images),
                "batch_size": args.batch_size,
                "threads": args.threads,
                "pytorch_images_per_s": round(pt_ips, 2),
                "onnx_images_per_s": round(ort_ips, 2),
                "onnx_speedup": round(ort_ips / pt_ips, 2),
                "same_captions": f"{same}/{len(images)}",
                "max_score_diff": float(f"{score_diff:.2g}"),
                "mean_tokens": round(statistics.mean(len(r["tokens"]) for r in outs["onnx"]), 1),
                "pytorch_seconds": [round(t, 3) for t in times["pytorch"]],
                "onnx_seconds": [round(t, 3) for t in times["onnx"]],
                **sizes,
            }
        )
        print(
            f"  {name} beams={beams}: PyTorch {pt_ips:.2f} img/s, ONNX {ort_ips:.2f} img/s", file=sys.stderr, flush=True
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="the demo model's checkpoint")
    p.add_argument("--annotations", required=True, help="its dataset (test images are captioned)")
    p.add_argument("--images", type=int, default=128, help="test images for the demo model")
    p.add_argument(
        "--resnet-images", type=int, default=16, help="test images for the ResNet-101 model (resized to 224 px)"
    )
    p.add_argument(
        "--vocab-size", type=int, default=10000, help="the ResNet-101 model's vocabulary (COCO's is about 10,000)"
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-resnet", action="store_true")
    p.add_argument("--quick", action="store_true", help="a smoke run: few images, one repeat")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args()
    if args.quick:
        args.images, args.resnet_images, args.repeats = 16, 2, 1

    images = test_images(args.annotations, max(args.images, args.resnet_images))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += bench_model(
            "demo", load_model(args.checkpoint), images[: args.images], args, args.checkpoint, Path(tmp)
        )
        if not args.skip_resnet:
            model = resnet101_model(args.vocab_size)
            checkpoint = synthetic_checkpoint(model, Path(tmp) / "resnet101.ckpt")
            rows += bench_model("resnet101_soft", model, images[: args.resnet_images], args, checkpoint, Path(tmp))

    print(
        f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"threads {args.threads}, batch {args.batch_size}, median of {args.repeats} interleaved runs"
    )
    print(
        "| model | beams | PyTorch img/s | ONNX img/s | ONNX / PyTorch | same captions | max score diff | checkpoint | safetensors folder | ONNX folder |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ckpt = f"{r['checkpoint_mb']} MB" if r["checkpoint_mb"] else "-"
        print(
            f"| {r['model']} | {r['num_beams']} | {r['pytorch_images_per_s']} | {r['onnx_images_per_s']} | "
            f"{r['onnx_speedup']}x | {r['same_captions']} | {r['max_score_diff']} | {ckpt} | "
            f"{r['safetensors_folder_mb']} MB | {r['onnx_folder_mb']} MB |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
