"""Throughput and memory benchmark of the Show, Attend and Tell code at COCO sizes.

    python -m tools.benchmarks.benchmark --device cpu --out bench.json          # full run
    python -m tools.benchmarks.benchmark --device cpu --quick                   # smoke run (< ~60 s on CPU)
    python -m tools.benchmarks.benchmark --device cuda --amp --out bench.json   # adds bf16 autocast rows
    python -m tools.benchmarks.benchmark --device cpu --sections train --compile  # adds torch.compile rows
    python -m tools.benchmarks.benchmark --device cpu --profile                 # torch.profiler of one soft step
    python -m tools.benchmarks.benchmark --device cuda --amp --sections graphs,load --out bench_graphs.json  # issue 15
    python -m tools.benchmarks.benchmark --device cpu --quick --sections decoding_options   # each decoding option beside beam 3

Sections (each a list of rows in the JSON, and a table on stdout):

- ``peak``: the matmul peak of this machine, measured in this run (n^3 fp32, and bf16 on CUDA).
- ``train``: one training step = decoder forward + losses + backward + Adam step, features given
  directly (no encoder), soft and hard attention, D = 2048 and 512. ``needed_gflop`` counts the
  FLOPs the step needs (real, non-padded steps only; backward = 2x forward) and ``peak_share`` is
  needed_gflop / time / peak.
- ``decode``: greedy and beam 3 / 5 at batch 1, 16, 64 against a loop over the same images one at
  a time (batch 1); ``speedup`` is per image. ``matmul_bound`` is the speed-up per image of the
  step's matrix products alone (batch x beams rows against beams rows): a one-image loop reads
  every weight matrix at each step for K rows, a batch does it for B x K, so this ratio bounds
  what batching can gain where the rest of the step costs the same per image either way.
- ``encode``: resnet101 and vgg16 (random weights) at 224 and 256 px; then, with the ecosystem
  extra, timm and OpenCLIP backbones (timm:<model>, open_clip:<model>) and resnet101 again at
  224 px, batch 16.
- ``load``: DataLoader throughput from JPEG files and from a feature cache (captioning.data.features.reader).
- ``scst``: one self-critical training step (captioning.objectives.SCST: K = 5 samples of B = 48
  images decoded at once, the greedy captions, the teacher-forced pass over the samples, backward,
  Adam) at the shapes demo's sizes and at COCO's, and inside it the CIDEr-D rewards of the 5 x 48
  samples and the 48 greedy captions (``reward_ms``, PTB tokenisation included) and their share of
  the step. The model is untrained: its captions run to ``max_new_tokens``, the worst case for both.

- ``variants``: the attention variants of configs/shapes_<variant>.yaml (issue 14; the paper's
  soft and hard models first; any decoder kind, the Transformer's and the conv decoder's configs
  too) at the shapes demo's sizes: the whole model (its small CNN on 64 px
  images, B = 48 pairs, the config's decoder and objective, Adam) for one training step
  (``train_ms_per_step``) and beam-3 decoding of 48 images (``beam3_images_per_s``, encoder
  included). The variants are timed round-robin (``--rounds`` rounds, a few steps each, the median
  of each variant), so that a busy machine slows them all alike: compare the rows of one run
  (``train_ratio`` is the variant's ms/step over the paper's soft model's, in the same run).
  ``--variant-sizes coco`` times the decoders at COCO's sizes instead (features given, no encoder).
- ``luong``: what Luong placement's batched teacher-forced pass gains: the decoder's training step
  (features given, forward + backward) with the paper's Bahdanau placement, with Luong placement
  as the decoder runs it (nn.LSTM over all steps, attention for all steps in a few batched
  products) and with Luong placement one step at a time (the decoding step in a loop over the
  running captions, as the Bahdanau pass must run), round-robin, at the demo's and COCO's sizes.

- ``graphs``: issue 15's rows. The training step (soft and hard attention, D = 2048, batch 32 and
  64) three ways: the default shrinking-batch pass, the static-shape pass (captions padded to a
  length bucket, every row at every step), and on CUDA the static-shape step captured as a CUDA
  graph (captioning.cuda_graphs.GraphedTrainingStep: forward, losses, backward, clipping; fused Adam
  after it), each in fp32, TF32 (CUDA) and bf16 autocast (``--amp``); ``pairs_per_s`` are caption
  pairs a second and ``gpu_busy`` the share of the wall time the GPU spent in kernels (torch.profiler
  over 5 steps; CUDA only). Then greedy and beam 3 / 5 at batch 64, plain and graphed
  (GenerationConfig.cuda_graphs), and the COCO epoch (566,747 pairs) at the fastest step rate beside
  the feature cache's read rate (the ``load`` section's warm-cache figure: run both sections in one
  command, ``--sections graphs,load``).
- ``decoding_options``: the decoding options of GenerationConfig beside plain beam search, at
  batch 64 (features given, the soft decoder; an untrained model, so every caption runs
  ``max_new_tokens``): beam 3 plain, with no_repeat_ngram_size 3, repetition_penalty 1.2,
  min_new_tokens 5, suppress_tokens <unk>, all four together, and diverse beam search (3 groups of
  one beam, diversity_penalty 0.5); then sampling with and without top_p 0.9. Each also with
  cuda_graphs on CUDA. Timed round-robin (``--rounds``, the median of each), ``ratio`` is the
  row's images/s over its baseline's (plain beam 3, or plain sampling) in the same run.

Memory: on CUDA the peak of torch.cuda.max_memory_allocated for each row; on CPU the process's
peak RSS (ru_maxrss) after the row and its growth during the row (a high-water mark: a row that
needs less than an earlier one shows 0 growth).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from captioning.decoding.search import GenerationConfig, beam_search, greedy_search  # noqa: E402
from captioning.fast import fast_decoder, fast_model  # noqa: E402
from captioning.fast.lstm import FastLSTM  # noqa: E402
from captioning.models.decoder import DecoderConfig, ShowAttendTellDecoder  # noqa: E402
from captioning.objectives import CrossEntropy, HardAttentionReinforce  # noqa: E402
from captioning.vocab import Vocabulary

PAD, BOS, EOS = Vocabulary.pad_id, Vocabulary.bos_id, Vocabulary.eos_id


# ---------------------------------------------------------------------------- helpers
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return r / 1024.0


class Memory:
    """Peak memory of a block: CUDA max allocated, or CPU peak RSS and its growth."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.rss0 = rss_mb()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.result = {"gpu_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}
        else:
            r = rss_mb()
            self.result = {"rss_peak_mb": round(r, 1), "rss_growth_mb": round(r - self.rss0, 1)}
        return False


def timed(fn, device, warmup: int, iters: int, min_time: float = 0.0, best: bool = False) -> float:
    """Seconds per call: warm up, then time ``iters`` calls (more while under ``min_time``).

    On the CPU every call is timed on its own and the median is returned (the minimum with
    ``best``), so that a noisy neighbour on a shared machine moves the figure less; on a GPU the
    calls run back to back and the mean is returned (one synchronisation at the end).
    """
    for _ in range(warmup):
        fn()
    sync(device)
    times, start = [], time.perf_counter()
    while len(times) < iters or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)  # on a GPU only the count is used (the calls are asynchronous)
    sync(device)
    if device.type == "cuda":
        return (time.perf_counter() - start) / len(times)
    return min(times) if best else float(np.median(times))


def make_captions(
    B: int, V: int, generator: torch.Generator, lo: int = 9, hi: int = 24, mean: float = 13.0, sd: float = 3.0
):
    """Captions of lengths (BOS and EOS included) from a clipped normal, mean ~13 tokens."""
    lengths = torch.randn(B, generator=generator).mul(sd).add(mean).round().clamp(lo, hi).long()
    T1 = int(lengths.max())
    captions = torch.full((B, T1), PAD, dtype=torch.long)
    for b, n in enumerate(lengths.tolist()):
        captions[b, 0] = BOS
        captions[b, 1 : n - 1] = torch.randint(3, V, (n - 2,), generator=generator)
        captions[b, n - 1] = EOS
    return captions, lengths


def needed_forward_flops(lengths: torch.Tensor, L: int, D: int, M: int, H: int, A: int, V: int) -> float:
    """FLOPs the teacher-forced forward pass needs, counting only real (non-padded) steps."""
    B = len(lengths)
    steps = (lengths - 1).clamp(min=0)
    T = int(steps.max())
    n_t = [(steps > t).sum().item() for t in range(T)]
    N = sum(n_t)  # real steps in the batch
    flops = B * L * D * A * 2  # W_a a, once per batch
    flops += B * D * 2 * H * 2  # h_0, c_0 from the mean annotation
    per_row = (
        H * (A + 1 + 4 * H) * 2  # W_h h, f_beta h and the LSTM's recurrent product, one matmul
        + L * A * 2  # tanh(W_a a + W_h h) (the add) and w^T (.) : ~2 per element
        + L * D * 2  # weighted sum of the annotation vectors
        + (M + D) * 4 * H * 2  # LSTM input weights: E y_{t-1} and z_t
        + (H * M + D * M + M * V) * 2  # deep output: L_h h, L_z z, L_o
    )
    return float(flops + N * per_row)


# ---------------------------------------------------------------------------- sections
def bench_peak(device, quick: bool) -> list[dict]:
    rows = []
    n = 1024 if quick else (8192 if device.type == "cuda" else 4096)
    dtypes = [torch.float32] + ([torch.bfloat16] if device.type == "cuda" else [])
    for dtype in dtypes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        s = timed(
            functools.partial(torch.matmul, a, b),
            device,
            warmup=1 if device.type == "cpu" else 3,
            iters=5 if device.type == "cpu" else 20,
            best=True,
        )
        rows.append(
            {
                "dtype": str(dtype).replace("torch.", ""),
                "n": n,
                "gflops": round(2 * n**3 / s / 1e9, 1),
                "tf32": bool(torch.backends.cuda.matmul.allow_tf32) if device.type == "cuda" else None,
            }
        )
        del a, b
    return rows


def build_decoder(attention: str, D: int, V: int, dim: int, device) -> ShowAttendTellDecoder:
    torch.manual_seed(0)
    return ShowAttendTellDecoder(
        V, D, DecoderConfig(embed_dim=dim, hidden_dim=dim, attention_dim=dim, dropout=0.5, attention_kind=attention)
    ).to(device)


def train_step_fn(dec, opt, features, captions, lengths, amp, plain: bool = False):
    """Forward with the paper's objective (the module's objective classes) + backward + Adam step, on
    the fast path's twin of ``dec`` as ``fit`` runs it (``plain``: the plain decoder itself)."""
    runner = dec if plain else fast_decoder(dec)
    objective = (HardAttentionReinforce if dec.attention_kind == "hard" else CrossEntropy)(doubly_stochastic=1.0).to(
        features.device
    )
    batch = {"captions": captions, "lengths": lengths}

    def step():
        opt.zero_grad(set_to_none=True)
        with amp:
            out = objective(runner, features, batch)  # the decoder stands in for the model: objectives call model(...)
        out.loss.backward()
        opt.step()
        objective.commit(out)

    return step


def bench_train(device, quick: bool, peaks: dict, amp_modes: list, compile_step: bool = False) -> list[dict]:
    rows = []
    V, dim, B, Lside = (2000, 256, 8, 7) if quick else (10000, 512, 32, 14)
    L = Lside * Lside
    g = torch.Generator().manual_seed(0)
    captions, lengths = make_captions(B, V, g)
    captions, lengths = captions.to(device), lengths.to(device)
    for D in (512,) if quick else (2048, 512):
        features = torch.randn(B, L, D, generator=g).to(device)
        flops = 3 * needed_forward_flops(lengths.cpu(), L, D, dim, dim, dim, V)
        variants = [(attention, amp_name, False, False) for attention in ("soft", "hard") for amp_name in amp_modes]
        variants += [(attention, "fp32", False, True) for attention in ("soft", "hard")]  # the plain model, as written
        if compile_step:  # the decoder step under torch.compile (model.compile_decoder), soft attention
            variants += [("soft", amp_name, True, False) for amp_name in amp_modes]
        for attention, amp_name, compiled, plain in variants:
            dec = build_decoder(attention, D, V, dim, device).train()
            if compiled:
                torch.manual_seed(0)  # the step compiled once, at construction (DecoderConfig.compile_step)
                dec = ShowAttendTellDecoder(V, D, dataclasses.replace(dec.config, compile_step=True)).to(device).train()
            opt = torch.optim.Adam(dec.parameters(), lr=1e-4, fused=True)  # as CaptioningModule
            amp = torch.autocast(device.type, dtype=torch.bfloat16) if amp_name == "bf16" else nullcontext()
            fn = train_step_fn(dec, opt, features, captions, lengths, amp, plain)
            with Memory(device) as mem:
                # two warm-up steps: the first allocates Adam's state, the second still page-faults on CPU
                s = timed(
                    fn,
                    device,
                    warmup=2 if device.type == "cpu" else 3,
                    iters=2 if quick else (5 if device.type == "cpu" else 20),
                    min_time=0.0 if quick else 3.0,
                )
            peak = peaks["bfloat16" if amp_name == "bf16" else "float32"]
            row = {
                "attention": attention,
                "precision": amp_name,
                "compiled": compiled,
                "model": "plain" if plain else "fast path",
                "B": B,
                "L": L,
                "D": D,
                "dim": dim,
                "V": V,
                "mean_tokens": round(lengths.float().mean().item(), 2),
                "ms_per_step": round(s * 1e3, 2),
                "images_per_s": round(B / s, 1),
                "needed_gflop": round(flops / 1e9, 2),
                "achieved_gflops": round(flops / s / 1e9, 1),
                "peak_share": round(flops / s / 1e9 / peak, 4),
            }
            row.update(mem.result)
            rows.append(row)
            print("  train", row, flush=True)
            del dec, opt
    return rows


def step_matmuls(dec: ShowAttendTellDecoder, rows: int, device) -> Callable[[], None]:
    """The matrix products of one decoding step for ``rows`` rows (images x beams), alone.

    hidden products (attention, gate, LSTM), the LSTM's embedding and context inputs, and the deep
    output layer: the work whose weights a one-image loop reads afresh at every step.
    """
    with torch.no_grad():
        w = FastLSTM(dec).weights()  # the fast path's fused products
    M, H, D = dec.E.embedding_dim, dec.hidden_dim, w.context.size(1)
    g = torch.Generator().manual_seed(2)
    e, h, z = (torch.randn(rows, n, generator=g).to(device) for n in (M, H, D))
    layers = [
        (lambda x: F.linear(x, *w.hidden), h),
        (lambda x: F.linear(x, w.embed), e),
        (lambda x: F.linear(x, w.context), z),
        (dec.L_h, h),
        (dec.L_o, e),
    ]
    if dec.L_z is not None:
        layers.append((dec.L_z, z))

    def fn():
        with torch.no_grad():
            for layer, x in layers:
                layer(x)

    return fn


def bench_decode(device, quick: bool, amp_modes: list) -> list[dict]:
    rows = []
    V, dim, D, Lside = (2000, 256, 512, 7) if quick else (10000, 512, 2048, 14)
    L = Lside * Lside
    max_new = 8 if quick else 20
    batches = (1, 8) if quick else (1, 16, 64)
    plain = build_decoder("soft", D, V, dim, device).eval()
    dec = fast_decoder(plain)  # what caption and evaluate run
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(max(batches), L, D, generator=g).to(device)
    cpu = device.type == "cpu"
    # An untrained model hardly ever says EOS: every caption runs max_new steps, batched or not.
    for amp_name in amp_modes:
        amp = torch.autocast(device.type, dtype=torch.bfloat16) if amp_name == "bf16" else nullcontext()
        for beams in (1, 3, 5):

            def run(x, k=beams):
                with amp:
                    if k == 1:
                        return greedy_search(dec, x, GenerationConfig(max_new_tokens=max_new))
                    return beam_search(dec, x, GenerationConfig(num_beams=k, max_new_tokens=max_new))

            # the one-image loop: the median time of one image, over several images
            images = itertools.cycle(range(feats.size(0)))
            s_one = timed(
                lambda: run(feats[[next(images)]]), device, warmup=1, iters=4 if quick else (8 if cpu else 32)
            )
            with amp:
                mm_one = timed(step_matmuls(plain, beams, device), device, warmup=2, iters=10 if cpu else 50)
            for B in batches:
                if amp_name == "bf16" and B != 64:
                    continue  # bf16 only where it could matter: the largest batch
                x = feats[:B]
                with Memory(device) as mem:
                    s = timed(lambda: run(x), device, warmup=1, iters=1 if quick else 3)
                with amp:
                    mm_batch = timed(step_matmuls(plain, B * beams, device), device, warmup=1, iters=5 if cpu else 50)
                row = {
                    "search": "greedy" if beams == 1 else f"beam{beams}",
                    "precision": amp_name,
                    "batch": B,
                    "max_new_tokens": max_new,
                    "images_per_s": round(B / s, 1),
                    "ms_per_batch": round(s * 1e3, 1),
                    "loop_images_per_s": round(1 / s_one, 1),
                    "speedup_per_image": round(s_one / (s / B), 2),
                    "matmul_bound": round(B * mm_one / mm_batch, 2),
                }
                row.update(mem.result)
                rows.append(row)
                print("  decode", row, flush=True)
    return rows


def bench_decoding_options(device, quick: bool, rounds: int) -> list[dict]:
    V, dim, D, Lside = (2000, 256, 512, 7) if quick else (10000, 512, 2048, 14)
    max_new, B = (8 if quick else 20), 64
    dec = fast_decoder(build_decoder("soft", D, V, dim, device).eval())
    feats = torch.randn(B, Lside * Lside, D, generator=torch.Generator().manual_seed(1)).to(device)
    beam = GenerationConfig(num_beams=3, max_new_tokens=max_new)
    sample = GenerationConfig(do_sample=True, max_new_tokens=max_new)
    options = [
        ("beam3", beam, "beam3"),
        ("beam3 no_repeat_ngram_size=3", beam.replace(no_repeat_ngram_size=3), "beam3"),
        ("beam3 repetition_penalty=1.2", beam.replace(repetition_penalty=1.2), "beam3"),
        ("beam3 min_new_tokens=5", beam.replace(min_new_tokens=5), "beam3"),
        ("beam3 suppress_tokens=<unk>", beam.replace(suppress_tokens=(Vocabulary.unk_id,)), "beam3"),
        (
            "beam3 all four",
            beam.replace(
                no_repeat_ngram_size=3, repetition_penalty=1.2, min_new_tokens=5, suppress_tokens=(Vocabulary.unk_id,)
            ),
            "beam3",
        ),
        ("diverse 3x1 penalty=0.5", beam.replace(num_beam_groups=3, diversity_penalty=0.5), "beam3"),
        ("sample", sample, "sample"),
        ("sample top_p=0.9", sample.replace(top_p=0.9), "sample"),
    ]
    if device.type == "cuda":
        options += [
            (f"{name} graphed", config.replace(cuda_graphs=True), f"{base} graphed")
            for name, config, base in options
            if not config.do_sample
        ]
    generator = torch.Generator(device=device).manual_seed(0)

    def run(config):
        if config.num_beams == 1:
            return greedy_search(dec, feats, config, generator)
        return beam_search(dec, feats, config)

    for _, config, _ in options:  # warm-up (and CUDA graph capture) of every option
        run(config)
    times = {name: [] for name, _, _ in options}
    for _ in range(max(rounds, 1)):
        for name, config, _ in options:
            times[name].append(timed(lambda: run(config), device, warmup=0, iters=1))
    rows, rates = [], {name: B / float(np.median(t)) for name, t in times.items()}
    for name, config, base in options:
        row = {
            "option": name,
            "batch": B,
            "max_new_tokens": max_new,
            "images_per_s": round(rates[name], 1),
            "ms_per_batch": round(1e3 * B / rates[name], 1),
            "ratio": round(rates[name] / rates[base], 2),
        }
        rows.append(row)
        print("  decoding_options", row, flush=True)
    return rows


def bench_encode(device, quick: bool, amp_modes: list) -> list[dict]:
    from captioning.models.encoders import EncoderConfig, build_encoder

    rows = []
    names = ("resnet101",) if quick else ("resnet101", "vgg16")
    sizes = (224,) if quick else (224, 256)
    B = 2 if quick else (4 if device.type == "cpu" else 64)
    runs = [(name, sizes, B) for name in names]
    try:  # timm / OpenCLIP backbones (the ecosystem extra) at 224 px, batch 16, beside resnet101's
        import open_clip  # noqa: F401
        import timm  # noqa: F401
    except ImportError:
        print("  encode: no timm / open_clip (pip install 'captioning[ecosystem]'): their rows left out", flush=True)
    else:
        Be = 2 if quick else 16
        ecosystem = (
            ("timm:resnet18",)
            if quick
            else (
                "resnet101",
                "timm:resnet18",
                "timm:convnext_tiny",
                "timm:convnext_base",
                "timm:vit_tiny_patch16_224",
                "timm:vit_base_patch16_224",
                "open_clip:ViT-B-32",
                "open_clip:ViT-B-16",
            )
        )
        runs += [(name, (224,), Be) for name in ecosystem]
    for name, sizes, B in runs:
        enc = build_encoder(EncoderConfig(name, pretrained=False)).to(device).eval()
        for size in sizes:
            for amp_name in amp_modes:
                amp = torch.autocast(device.type, dtype=torch.bfloat16) if amp_name == "bf16" else nullcontext()
                x = torch.rand(B, 3, size, size, device=device)
                with Memory(device) as mem, torch.inference_mode():

                    def fn(enc=enc, x=x, amp=amp):
                        with amp:
                            return enc(x)

                    s = timed(fn, device, warmup=1, iters=1 if device.type == "cpu" else 10)
                    grid = tuple(fn().shape[1:])
                row = {
                    "encoder": name,
                    "size": size,
                    "precision": amp_name,
                    "batch": B,
                    "grid": list(grid),
                    "images_per_s": round(B / s, 1),
                    "ms_per_batch": round(s * 1e3, 1),
                }
                row.update(mem.result)
                rows.append(row)
                print("  encode", row, flush=True)
        del enc
    return rows


class _StubEncoder(torch.nn.Module):
    """Images -> a fixed-size random-looking grid, to fill a feature cache fast."""

    def __init__(self, L: int, D: int):
        super().__init__()
        self.L, self.D = L, D

    def forward(self, images):
        B = images.size(0)
        base = images.mean((1, 2, 3)).view(B, 1, 1)
        return base + torch.linspace(0, 1, self.L * self.D, device=images.device).view(1, self.L, self.D)


def bench_load(device, quick: bool, workers: int) -> list[dict]:
    from PIL import Image
    from torch.utils.data import DataLoader

    from captioning.data.datasets import Collate, ImageDataset
    from captioning.data.features.reader import FeatureCache
    from captioning.data.features.writer import extract_features
    from captioning.data.records import ImageRecord

    rows = []
    n = 40 if quick else 200
    B = 16 if quick else 32
    L, D = (49, 512) if quick else (196, 2048)
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        records = []
        for i in range(n):  # COCO-like 640x480 JPEGs
            arr = (rng.random((480, 640, 3)) * 64 + np.linspace(0, 190, 640)[None, :, None]).astype(np.uint8)
            Image.fromarray(arr).save(os.path.join(tmp, f"{i}.jpg"), quality=90)
            records.append(ImageRecord(i, i, f"{i}.jpg", "train", ["a"], [["a"]]))
        sizes = (224,) if quick else (224, 256)
        for size in sizes:
            ds = ImageDataset(records, tmp, size)
            loader = DataLoader(
                ds, batch_size=B, num_workers=workers, collate_fn=Collate(PAD, "images", ds.visual_shape)
            )
            with Memory(torch.device("cpu")) as mem:
                t0 = time.perf_counter()
                count = sum(len(b["image_ids"]) for b in loader)
                s = time.perf_counter() - t0
            row = {
                "source": f"jpeg 640x480 -> {size}px",
                "workers": workers,
                "batch": B,
                "images": count,
                "images_per_s": round(count / s, 1),
            }
            row.update(mem.result)
            rows.append(row)
            print("  load", row, flush=True)
        cache_dir = os.path.join(tmp, "cache")
        extract_features(records, _StubEncoder(L, D), tmp, cache_dir, 64, batch_size=64, device="cpu", progress=False)
        cache = FeatureCache(cache_dir)
        ds = ImageDataset(records, tmp, 224, features=cache)
        loader = DataLoader(ds, batch_size=B, num_workers=workers, collate_fn=Collate(PAD, "features", ds.visual_shape))
        for epoch in ("cold", "warm"):  # warm: the cache file is in the page cache
            with Memory(torch.device("cpu")) as mem:
                t0 = time.perf_counter()
                count = sum(len(b["image_ids"]) for b in loader)
                s = time.perf_counter() - t0
            row = {
                "source": f"feature cache {L}x{D} fp16 ({epoch})",
                "workers": workers,
                "batch": B,
                "images": count,
                "images_per_s": round(count / s, 1),
                "mb_per_s": round(count * L * D * 2 / s / 2**20, 1),
            }
            row.update(mem.result)
            rows.append(row)
            print("  load", row, flush=True)
    return rows


def bench_scst(device, quick: bool) -> list[dict]:
    from captioning.models.encoders import EncoderConfig
    from captioning.models.show_attend_tell import ShowAttendTell
    from captioning.objectives import SCST

    rows = []
    # (name, V, embed/hidden/attention, grid L, D, images B, max_new_tokens)
    sizes = [("shapes demo", 40, (128, 256, 128), 64, 256, 48, 30), ("COCO", 10000, (512, 512, 512), 196, 2048, 48, 16)]
    if quick:
        sizes = [("quick", 2000, (128, 128, 128), 49, 256, 8, 12)]
    for name, V, (M, H, A), L, D, B, max_new in sizes:
        vocab = Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(V - 4)])
        torch.manual_seed(0)
        model = (
            ShowAttendTell(
                EncoderConfig(name="small_cnn", pretrained=False, channels=(4,), dim=D),
                DecoderConfig(embed_dim=M, hidden_dim=H, attention_dim=A, dropout=0.5),
                vocab,
            )
            .to(device)
            .train()
        )
        objective = SCST(num_samples=5, baseline="greedy", max_new_tokens=max_new)
        rng = np.random.default_rng(0)
        zipf = lambda n: " ".join(f"w{min(int(i), V - 5)}" for i in rng.zipf(1.3, n))  # noqa: E731
        n_images = 200 if quick else 20000  # the training references (COCO has 113k images; df lookups are hashed)
        objective.set_references({i: [zipf(int(rng.integers(8, 14))) for _ in range(5)] for i in range(n_images)})
        _ = objective.cider  # the document frequencies, once per run
        reward_times: list = []
        rewards = objective.rewards

        def timed_rewards(*args):
            t = time.perf_counter()
            out = rewards(*args)
            reward_times.append(time.perf_counter() - t)
            return out

        objective.rewards = timed_rewards
        features = torch.randn(B, L, D, device=device)
        batch = {"image_ids": torch.arange(B, device=device)}
        opt = torch.optim.Adam(model.decoder.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            out = objective(model, features, batch)
            out.loss.backward()
            opt.step()

        times = []
        for i in range(1 + (1 if quick else 3)):
            reward_times.clear()
            sync(device)
            t = time.perf_counter()
            step()
            sync(device)
            if i:  # the first is a warm-up
                times.append((time.perf_counter() - t, sum(reward_times)))
        step_s, reward_s = float(np.median([t for t, _ in times])), float(np.median([r for _, r in times]))
        row = {
            "sizes": name,
            "B": B,
            "K": 5,
            "L": L,
            "D": D,
            "dim": H,
            "V": V,
            "max_new_tokens": max_new,
            "ms_per_step": round(step_s * 1e3, 1),
            "reward_ms": round(reward_s * 1e3, 1),
            "reward_share": round(reward_s / step_s, 4),
        }
        rows.append(row)
        print("  scst", row, flush=True)
    return rows


VARIANTS = ("soft", "hard", "dot", "general", "scaled_dot", "multihead", "luong", "local", "refiner")


def variant_config(name: str) -> dict:
    """(encoder, decoder, objective init_args) of configs/shapes_<name>.yaml."""
    import yaml

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "configs", f"shapes_{name}.yaml")) as f:
        model = yaml.safe_load(f)["model"]
    return model["encoder"], model["decoder"], model["objective"]


def output_layer(decoder) -> torch.nn.Linear:
    """The decoder's last layer, to the vocabulary: the LSTM's L_o, the Transformer's out_logits, conv's W_o."""
    for name in ("L_o", "out_logits", "W_o"):
        if isinstance(getattr(decoder, name, None), torch.nn.Linear):
            return getattr(decoder, name)
    raise ValueError(f"{type(decoder).__name__}: no output layer among L_o, out_logits, W_o")


def bench_variants(device, quick: bool, rounds: int, sizes: str = "demo", names=VARIANTS) -> list[dict]:
    from captioning.models.encoders import EncoderConfig
    from captioning.models.kinds import decoder_config
    from captioning.models.show_attend_tell import ShowAttendTell
    from captioning.objectives import objective_from_spec

    coco = sizes == "coco"
    V, B = (10000, 32) if coco else (40, 48)
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(V - 4)])
    g = torch.Generator().manual_seed(0)
    captions, lengths = (
        make_captions(B, V, g, lo=9, hi=24, mean=13.0)
        if coco
        else make_captions(B, V, g, lo=6, hi=28, mean=15.0, sd=5.0)
    )
    captions, lengths = captions.to(device), lengths.to(device)
    images = torch.rand(B, 3, 64, 64, generator=g).to(device)
    features = torch.randn(B, 196, 2048, generator=g).to(device) if coco else None
    steps_per_round, max_new = (1, 8) if quick else (3, 30)
    runs = {}
    for name in names:
        encoder, decoder, objective = variant_config(name)
        if coco and decoder.get("kind", "lstm") == "lstm":
            decoder = dict(
                decoder,
                embed_dim=512,
                hidden_dim=512,
                attention_dim=512,
                **({"local_sigma": 1.5 * 14 / 8} if decoder.get("window") == "local" else {}),
            )
            if decoder.get("score") == "dot":
                decoder["hidden_dim"] = 2048  # dot needs H = D
        torch.manual_seed(0)
        model = ShowAttendTell(EncoderConfig(**encoder, pretrained=False), decoder_config(decoder), vocab).to(device)
        decoding = ShowAttendTell(EncoderConfig(**encoder, pretrained=False), decoder_config(decoder), vocab).to(device)
        with torch.no_grad():  # untrained models end their captions at random: this one never does,
            output_layer(decoding.decoder).bias[EOS] = -1e4  # so every variant decodes max_new_tokens steps
        obj = objective_from_spec(objective).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        batch = {"captions": captions, "lengths": lengths}

        def train(model=model, obj=obj, opt=opt):
            model.train()
            for _ in range(steps_per_round):
                opt.zero_grad(set_to_none=True)
                x = features if coco else model.encoder(images)
                out = obj(fast_model(model), x, batch)
                out.loss.backward()
                opt.step()
                obj.commit(out)

        def decode(model=decoding):
            model.eval()
            with torch.no_grad():
                x = features if coco else model.encoder(images)
                beam_search(fast_decoder(model.decoder), x, GenerationConfig(num_beams=3, max_new_tokens=max_new))

        runs[name] = (train, decode, decoder, sum(p.numel() for p in model.parameters()))
        train(), decode()  # warm-up
    times = {name: ([], []) for name in runs}
    for _ in range(rounds):  # round-robin: a noisy neighbour slows every variant alike
        for name, (train, decode, *_) in runs.items():
            for fn, out in ((train, times[name][0]), (decode, times[name][1])):
                sync(device)
                t = time.perf_counter()
                fn()
                sync(device)
                out.append(time.perf_counter() - t)
    rows = []
    base = None
    for name, (train, decode, decoder, params) in runs.items():
        train_s = float(np.median(times[name][0])) / steps_per_round
        decode_s = float(np.median(times[name][1]))
        base = base or train_s
        rows.append(
            {
                "variant": name,
                "sizes": sizes,
                "B": B,
                "params": params,
                "train_ms_per_step": round(train_s * 1e3, 1),
                "train_ratio": round(train_s / base, 3),
                "beam3_images_per_s": round(B / decode_s, 1),
                "max_new_tokens": max_new,
            }
        )
        print("  variants", rows[-1], flush=True)
    return rows


def luong_stepwise_loss(dec: ShowAttendTellDecoder, features, captions, lengths):
    """The summed caption NLL of a Luong decoder run one step at a time (running captions only)."""
    from captioning.objectives.cross_entropy import caption_log_likelihood

    T = captions.size(1) - 1
    steps = (lengths - 1).clamp(min=0, max=T)
    steps_sorted, order = steps.sort(descending=True)
    features, captions = features[order], captions[order]
    embedded = dec.E(captions[:, :-1])
    state = dec.initial_state(features)
    active = (steps_sorted.unsqueeze(0) > torch.arange(T, device=steps.device).unsqueeze(1)).sum(1).tolist()
    logits = []
    for t, n in enumerate(active):
        if n == 0:
            break
        if n < state.h.size(0):
            state = state.select(slice(0, n))
        h, c, z, _, _ = dec.recur(embedded[:n, t], state, "expected")
        state = state.with_recurrent(h, c)
        logits.append(dec.deep_output(embedded[:n, t], h, z))
    mask = torch.arange(T, device=steps.device).unsqueeze(0) < steps_sorted.unsqueeze(1)
    # step-major rows -> mask (row-major) order
    step_of = torch.cat([torch.full((n,), t) for t, n in enumerate(active) if n])
    row_of = torch.cat([torch.arange(n) for n in active if n])
    flat = (row_of * T + step_of).argsort()
    return -caption_log_likelihood(torch.cat(logits)[flat], captions[:, 1:], mask).sum()


def bench_luong(device, quick: bool, rounds: int) -> list[dict]:
    from captioning.objectives.cross_entropy import caption_log_likelihood

    rows = []
    sizes = [("demo", 40, 128, 256, 128, 64, 256, 48), ("COCO", 10000, 512, 512, 512, 196, 2048, 32)]
    if quick:
        sizes = [("quick", 40, 32, 64, 32, 16, 64, 8)]
    for name, V, M, H, A, L, D, B in sizes:
        g = torch.Generator().manual_seed(0)
        captions, lengths = (
            make_captions(B, V, g, lo=6, hi=28, mean=15.0, sd=5.0) if name != "COCO" else make_captions(B, V, g)
        )
        captions, lengths = captions.to(device), lengths.to(device)
        features = torch.randn(B, L, D, generator=g).to(device)
        fns = {}
        for label, placement, stepwise in (
            ("bahdanau", "bahdanau", False),
            ("luong batched", "luong", False),
            ("luong step by step", "luong", True),
        ):
            torch.manual_seed(0)
            dec = (
                ShowAttendTellDecoder(
                    V, D, DecoderConfig(embed_dim=M, hidden_dim=H, attention_dim=A, dropout=0.0, placement=placement)
                )
                .to(device)
                .train()
            )

            def fn(dec=dec, stepwise=stepwise):
                if stepwise:
                    loss = luong_stepwise_loss(dec, features, captions, lengths)
                else:
                    out = fast_decoder(dec)(features, captions, lengths)
                    loss = -caption_log_likelihood(out.logits, captions[:, 1:], out.mask).sum()
                loss.backward()
                return loss.detach()

            fns[label] = fn
        losses = {label: float(fn()) for label, fn in fns.items()}  # warm-up; the two Luong passes agree
        times = {label: [] for label in fns}
        for _ in range(rounds):
            for label, fn in fns.items():
                sync(device)
                t = time.perf_counter()
                fn()
                sync(device)
                times[label].append(time.perf_counter() - t)
        base = float(np.median(times["bahdanau"]))
        for label in fns:
            s_ = float(np.median(times[label]))
            rows.append(
                {
                    "sizes": name,
                    "pass": label,
                    "B": B,
                    "L": L,
                    "D": D,
                    "ms_fwd_bwd": round(s_ * 1e3, 1),
                    "ratio_to_bahdanau": round(s_ / base, 3),
                    "loss": round(losses[label], 4),
                }
            )
            print("  luong", rows[-1], flush=True)
    return rows


COCO_TRAIN_PAIRS = 566_747  # caption pairs of the Karpathy train split (113,287 images)


def gpu_busy(fn, device, steps: int = 5):
    """The share of the wall time of ``steps`` calls the GPU spends in kernels (torch.profiler); None on a CPU."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        wall = time.perf_counter() - t0
    busy_us = sum(e.self_device_time_total for e in prof.key_averages())
    return round(busy_us / 1e6 / wall, 3)


def graphs_step_fn(dec, opt, features, captions, lengths, amp, how: str):
    """One training step: ``how`` = "dynamic" (the default pass), "static" or "graph" (captured; both
    run the objective on the static-shape pass: GraphedTrainingStep passes ``static=True``)."""
    from captioning.training.captured_step import GraphedTrainingStep

    if how == "dynamic":
        return train_step_fn(dec, opt, features, captions, lengths, amp)
    objective = (HardAttentionReinforce if dec.attention_kind == "hard" else CrossEntropy)(doubly_stochastic=1.0).to(
        features.device
    )
    bucket = next(n for n in (16, 24, 32, 48, 64) if n >= captions.size(1))  # CaptioningModule.length_buckets
    captions = F.pad(captions, (0, bucket - captions.size(1)), value=PAD)

    twin = fast_decoder(dec)

    class Autocast(torch.nn.Module):  # the objective calls model(...): run the decoder's twin under autocast
        def __init__(self):
            super().__init__()
            self.decoder = dec

        def forward(self, *a, **k):
            with amp:
                return twin(*a, **k)

    step = GraphedTrainingStep(
        Autocast(), objective, [p for p in dec.parameters() if p.requires_grad], clip=5.0, capture=(how == "graph")
    )

    def fn():
        out = step(features, captions, lengths)
        opt.step()
        return out

    return fn


def bench_graphs(device, quick: bool, amp_modes: list, load_rows: list) -> list[dict]:
    rows = []
    V, dim, Lside, D = (2000, 256, 7, 512) if quick else (10000, 512, 14, 2048)
    L = Lside * Lside
    cuda = device.type == "cuda"
    precisions = ["fp32"] + (["tf32"] if cuda else []) + (["bf16"] if "bf16" in amp_modes else [])
    hows = ["dynamic", "static"] + (["graph"] if cuda else [])
    g = torch.Generator().manual_seed(0)
    base = {}
    for attention in ("soft", "hard"):
        for B in (8,) if quick else (32, 64):
            captions, lengths = make_captions(B, V, g)
            captions, lengths = captions.to(device), lengths.to(device)
            features = torch.randn(B, L, D, generator=g).to(device)
            for precision in precisions:
                if cuda:
                    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
                amp = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
                for how in hows:
                    dec = build_decoder(attention, D, V, dim, device).train()
                    opt = torch.optim.Adam(dec.parameters(), lr=1e-4, fused=True)
                    fn = graphs_step_fn(dec, opt, features, captions, lengths, amp, how)
                    with Memory(device) as mem:
                        s = timed(
                            fn,
                            device,
                            warmup=3,
                            iters=2 if quick else (5 if not cuda else 30),
                            min_time=0.0 if quick else 3.0,
                        )
                    key = (attention, B)
                    if how == "dynamic" and precision == "fp32":
                        base[key] = s
                    row = {
                        "what": "train",
                        "attention": attention,
                        "batch": B,
                        "precision": precision,
                        "pass": how,
                        "ms_per_step": round(s * 1e3, 2),
                        "pairs_per_s": round(B / s, 1),
                        "x_default_fp32": round(base[key] / s, 2) if key in base else None,
                        "gpu_busy": gpu_busy(fn, device),
                    }
                    row.update(mem.result)
                    rows.append(row)
                    print("  graphs", row, flush=True)
                    del dec, opt, fn
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    # decoding: plain and graphed search at batch 64
    from captioning.decoding.search import generate

    dec = fast_decoder(build_decoder("soft", D, V, dim, device).eval())
    B = 8 if quick else 64
    feats = torch.randn(B, L, D, generator=g).to(device)
    max_new = 8 if quick else 20
    for beams in (1, 3, 5):
        for graphed in (False, True):
            config = GenerationConfig(num_beams=beams, max_new_tokens=max_new, cuda_graphs=graphed)
            run = lambda c=config: generate(dec, feats, c)  # noqa: E731
            s = timed(run, device, warmup=2, iters=2 if quick else (3 if not cuda else 10))
            row = {
                "what": "decode",
                "search": "greedy" if beams == 1 else f"beam{beams}",
                "batch": B,
                "graphed": graphed,
                "max_new_tokens": max_new,
                "images_per_s": round(B / s, 1),
                "gpu_busy": gpu_busy(run, device, steps=2),
            }
            rows.append(row)
            print("  graphs", row, flush=True)
    # the COCO epoch: the fastest training row against the feature cache's read rate
    best = max((r for r in rows if r["what"] == "train"), key=lambda r: r["pairs_per_s"])
    cache = [r for r in load_rows if r.get("source", "").startswith("feature cache") and "warm" in r["source"]]
    read = cache[-1]["images_per_s"] * 5 if cache else None  # 5 captions per image: pairs a second
    rows.append(
        {
            "what": "coco_epoch",
            "pairs": COCO_TRAIN_PAIRS,
            "step_pairs_per_s": best["pairs_per_s"],
            "step_row": f"{best['attention']} B{best['batch']} {best['precision']} {best['pass']}",
            "cache_pairs_per_s": read,
            "epoch_min_step_bound": round(COCO_TRAIN_PAIRS / best["pairs_per_s"] / 60, 2),
            "epoch_min_cache_bound": round(COCO_TRAIN_PAIRS / read / 60, 2) if read else None,
        }
    )
    print("  graphs", rows[-1], flush=True)
    return rows


def profile_step(device, top: int = 25) -> None:
    """torch.profiler of one soft-attention training step at COCO sizes."""
    from torch.profiler import ProfilerActivity, profile

    V, dim, B, L, D = 10000, 512, 32, 196, 2048
    g = torch.Generator().manual_seed(0)
    captions, lengths = make_captions(B, V, g)
    features = torch.randn(B, L, D, generator=g).to(device)
    captions, lengths = captions.to(device), lengths.to(device)
    dec = build_decoder("soft", D, V, dim, device).train()
    opt = torch.optim.Adam(dec.parameters(), lr=1e-4, fused=True)  # as CaptioningModule
    fn = train_step_fn(dec, opt, features, captions, lengths, nullcontext())
    for _ in range(3):  # Adam's state, first-touch page faults, allocator warm-up
        fn()
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, record_shapes=False) as prof:
        fn()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=top))


# ---------------------------------------------------------------------------- report
def table(title: str, rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [f"### {title}", "", line(keys), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(c) for c in cells]
    return "\n".join(out) + "\n"


def machine(device) -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.processor()
            )
    except OSError:
        info["cpu"] = platform.processor()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small sizes, a smoke run (under ~60 s on CPU)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument(
        "--amp", action="store_true", help="also bf16 autocast rows (training, beam search at batch 64, encoders)"
    )
    p.add_argument(
        "--compile", action="store_true", help="also training rows with the decoder step under torch.compile"
    )
    p.add_argument(
        "--sections",
        default="train,decode,encode,load,scst",
        help="comma-separated subset of train,decode,encode,load,scst,variants,luong,graphs,decoding_options",
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="'variants': round-robin rounds (the median of each variant is kept)"
    )
    p.add_argument(
        "--variant-sizes",
        choices=("demo", "coco"),
        default="demo",
        help="'variants': the shapes demo's sizes or COCO's",
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="'variants': which configs/shapes_<name>.yaml, comma-separated"
    )
    p.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="DataLoader workers for 'load'")
    p.add_argument("--profile", action="store_true", help="only profile one soft training step at COCO sizes")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    if args.profile:
        profile_step(device)
        return 0
    amp_modes = ["fp32"] + (["bf16"] if args.amp else [])
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    t_start = time.perf_counter()
    result = {
        "machine": machine(device),
        "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
        "quick": args.quick,
    }
    print(result["machine"], flush=True)
    peak_rows = bench_peak(device, args.quick)
    result["peak"] = peak_rows
    peaks = {r["dtype"]: r["gflops"] for r in peak_rows}
    peaks.setdefault("bfloat16", peaks["float32"])
    print("  peak", peak_rows, flush=True)
    if "train" in sections:
        result["train"] = bench_train(device, args.quick, peaks, amp_modes, args.compile)
    if "decode" in sections:
        result["decode"] = bench_decode(device, args.quick, amp_modes)
    if "encode" in sections:
        result["encode"] = bench_encode(device, args.quick, amp_modes)
    if "load" in sections:
        result["load"] = bench_load(device, args.quick, args.workers)
    if "scst" in sections:
        result["scst"] = bench_scst(device, args.quick)
    if "variants" in sections:
        result["variants"] = bench_variants(
            device,
            args.quick,
            args.rounds,
            args.variant_sizes,
            [v.strip() for v in args.variants.split(",") if v.strip()],
        )
    if "luong" in sections:
        result["luong"] = bench_luong(device, args.quick, args.rounds)
    if "graphs" in sections:
        result["graphs"] = bench_graphs(device, args.quick, amp_modes, result.get("load", []))
    if "decoding_options" in sections:
        result["decoding_options"] = bench_decoding_options(device, args.quick, args.rounds)
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    print()
    for name in (
        "peak",
        "train",
        "decode",
        "encode",
        "load",
        "scst",
        "variants",
        "luong",
        "graphs",
        "decoding_options",
    ):
        if name in result:
            print(table(name, result[name]))
    print(f"total {result['seconds']} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
