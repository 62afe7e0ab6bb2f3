"""This project against the most used PyTorch port of Show, Attend and Tell, at COCO's sizes, in one run.

    python -m tools.benchmarks.peer --peer PEER_CHECKOUT --tree . --tree OTHER_CHECKOUT --out peer.json

PEER_CHECKOUT is a checkout of sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning (its models.py and
caption.py are used as they are; nothing of it is kept in this repository). Each ``--tree`` is a
checkout of this project (the one to measure, and e.g. an earlier commit), imported in its own
process. Sizes: batch 32, a 14 x 14 grid of 2048-d features, embedding, attention and LSTM 512,
10,000 words, captions of 9 to 24 tokens (mean 13), float32, random weights.

- training step: the peer's train.py step (its decoder's forward, cross-entropy over the packed
  steps plus its doubly stochastic term, backward, gradient clipping at 5, Adam); this project's
  ``fit`` step (the paper's objective on the fast path's twin, clipping at 5, fused Adam).
- beam 5: the peer's caption.py search (one image at a time; ``top_k_words / vocab_size``, which
  today's PyTorch makes a float division, read as ``//``), against this project's batched search of
  32 images; both decode 51 words (EOS made impossible; the peer's search ends at step 51 and then
  fails to pick a finished caption: that error is caught, the loop's time kept).

Sides run in turn in fresh processes for ``--rounds`` rounds; medians are reported, and the ratios
of each tree to the peer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

V, B, GRID, D, DIM = 10000, 32, 14, 2048, 512
WORDS = 51  # the peer's search runs steps 1 .. 51


def captions(g):
    """(B, 25) token ids and lengths of 9 to 24 tokens (BOS, words, EOS), as the benchmark's."""
    import torch

    lengths = torch.clamp(torch.normal(13.0, 3.0, (B,), generator=g).round().long(), 9, 24)
    caps = torch.randint(4, V, (B, int(lengths.max())), generator=g)
    caps[:, 0] = 1
    for i, n in enumerate(lengths.tolist()):
        caps[i, n - 1] = 2
        caps[i, n:] = 0
    return caps, lengths


def timed(fn, n: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_peer(peer: Path, steps: int, images: int) -> dict:
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence

    for name in (
        "matplotlib",
        "matplotlib.pyplot",
        "matplotlib.cm",
        "skimage",
        "skimage.transform",
        "scipy",
        "scipy.misc",
    ):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["scipy.misc"].imread = lambda path: torch.zeros(8, 8, 3).numpy()
    sys.modules["scipy.misc"].imresize = lambda img, size: torch.zeros(*size, 3).numpy()
    sys.path.insert(0, str(peer))
    import models  # the peer's

    torch.manual_seed(0)
    decoder = models.DecoderWithAttention(DIM, DIM, DIM, V, D, dropout=0.5)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=4e-4)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(B, GRID, GRID, D, generator=g)
    caps, lengths = captions(g)

    def train_step():  # train.py's step
        decoder.train()
        scores, caps_sorted, decode_lengths, alphas, _ = decoder(features, caps, lengths.unsqueeze(1))
        targets = pack_padded_sequence(caps_sorted[:, 1:], decode_lengths, batch_first=True).data
        scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
        loss = torch.nn.functional.cross_entropy(scores, targets) + 1.0 * ((1.0 - alphas.sum(dim=1)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(decoder.parameters(), 5.0)  # train.py's clip_gradient
        optimizer.step()

    source = (peer / "caption.py").read_text().replace("top_k_words / vocab_size", "top_k_words // vocab_size")
    namespace: dict = {"__name__": "peer_caption"}
    exec(compile(source.split("def visualize_att")[0], str(peer / "caption.py"), "exec"), namespace)
    word_map = {"<start>": 1, "<end>": 2, **{f"w{i}": i for i in range(3, V)}}
    decoder.eval()
    with torch.no_grad():
        decoder.fc.bias[2] = -1e4  # EOS impossible: 51 words, as ours

    def beam5():
        for i in range(images):
            encoder = lambda image, i=i: features[i : i + 1]  # noqa: E731 (the features stand for the image)
            try:
                with torch.no_grad():
                    namespace["caption_image_beam_search"](encoder, decoder, "image.jpg", word_map, beam_size=5)
            except ValueError:  # no finished caption to return after 51 steps
                pass

    return {"train_ms": 1e3 * timed(train_step, steps), "beam5_images_per_s": images / timed(beam5, 1)}


def measure_tree(steps: int) -> dict:
    import torch

    import captioning

    wanted = Path(os.environ.get("PYTHONPATH", ".").split(os.pathsep)[0]).resolve()
    if Path(captioning.__file__).resolve().parents[1] != wanted:  # the tree asked for, not another
        raise RuntimeError(f"measuring {captioning.__file__}, not the tree {wanted}")

    from captioning.decoding.search import GenerationConfig, beam_search
    from captioning.models.decoder import DecoderConfig, ShowAttendTellDecoder
    from captioning.objectives import CrossEntropy

    if (wanted / "captioning" / "fast").is_dir():
        from captioning.fast import fast_decoder  # what fit and caption run
    else:  # a tree before the fast path: its decoder is fast as it is
        fast_decoder = lambda decoder: decoder  # noqa: E731
    torch.manual_seed(0)
    config = DecoderConfig(embed_dim=DIM, hidden_dim=DIM, attention_dim=DIM, dropout=0.5)
    plain = ShowAttendTellDecoder(V, D, config)
    optimizer = torch.optim.Adam(plain.parameters(), lr=4e-4, fused=True)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(B, GRID * GRID, D, generator=g)
    caps, lengths = captions(g)
    batch = {"captions": caps, "lengths": lengths}
    objective = CrossEntropy(doubly_stochastic=1.0)

    def train_step():
        plain.train()
        loss = objective(fast_decoder(plain), features, batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 5.0)
        optimizer.step()

    plain.eval()
    twin = fast_decoder(plain)
    out = getattr(plain, "L_o", None) or plain.out_logits
    with torch.no_grad():
        out.bias[2] = -1e4
    search = GenerationConfig(num_beams=5, max_new_tokens=WORDS)
    beam = lambda: beam_search(twin, features, search)  # noqa: E731
    return {"train_ms": 1e3 * timed(train_step, steps), "beam5_images_per_s": B / timed(beam, 1)}


def worker(args) -> None:
    result = measure_peer(Path(args.peer), args.steps, args.images) if args.side == "peer" else measure_tree(args.steps)
    print(json.dumps(result))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", required=True, help="a checkout of sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning")
    parser.add_argument("--tree", action="append", default=[], help="a checkout of this project (repeat to compare)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per round (median)")
    parser.add_argument("--images", type=int, default=4, help="images the peer's beam search captions per round")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        worker(args)
        return 0
    trees = [str(Path(t).resolve()) for t in (args.tree or ["."])]
    sides = [("peer", None)] + [(f"tree:{t}", t) for t in trees]
    results: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        for name, tree in sides:
            # run as a script from the tree's own folder, so that `captioning` is the tree's (with
            # `python -m` from this checkout, the working folder would come first on sys.path)
            here = Path(__file__).resolve()
            env = dict(os.environ, PYTHONPATH=tree or str(here.parents[2]))
            cmd = [sys.executable, str(here), "--peer", args.peer, "--side", "peer" if tree is None else "tree",
                   "--steps", str(args.steps), "--images", str(args.images)]  # fmt: skip
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree or here.parents[2])
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {results[name][-1]}", flush=True)
    summary = {
        name: {key: statistics.median(row[key] for row in rows) for key in rows[0]} for name, rows in results.items()
    }
    peer = summary["peer"]
    for name, row in summary.items():
        row["train_speedup"] = peer["train_ms"] / row["train_ms"]
        row["beam5_speedup"] = row["beam5_images_per_s"] / peer["beam5_images_per_s"]
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"rounds": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
