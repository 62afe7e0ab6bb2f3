"""What a Transformer's ``views["self"]`` (its word-by-word self-attention, kept per step for the
pictures) costs in decoding: the shapes config's Transformer (width 128, 4 heads, 2 layers, random
weights) decodes a batch of random grids with and without the view, greedy and with beams, in
interleaved runs; it prints the median times and their ratio. docs/ATLAS.md ("What it costs") has
the figures.

    python -m tools.benchmarks.self_view [--batch 100] [--tokens 31] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=100, help="images decoded together")
    p.add_argument("--tokens", type=int, default=31, help="tokens per caption (every caption runs to it)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs of each, interleaved")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args(argv)

    import torch

    from captioning.decoding.generation import GenerationConfig
    from captioning.decoding.search import generate
    from captioning.models.decoder import Glimpse
    from captioning.models.transformer import TransformerConfig, TransformerDecoder

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    decoder = TransformerConfig(hidden_dim=128, heads=4, layers=2, dropout=0.0).build(40, 256).eval()
    features = torch.randn(args.batch, 64, 256)
    with_view = TransformerDecoder.step

    def without_view(self, *a, **k):  # the same step, its glimpse without the view
        log_probs, state, g = with_view(self, *a, **k)
        return log_probs, state, Glimpse(g.context, g.alpha, g.location, head_alpha=g.head_alpha)

    try:
        for beams in (1, 3):
            config = GenerationConfig(num_beams=beams, max_new_tokens=args.tokens, min_new_tokens=args.tokens - 1)
            times: dict[str, list[float]] = {"with": [], "without": []}
            for _ in range(args.repeats):
                for name, step in (("with", with_view), ("without", without_view)):
                    TransformerDecoder.step = step
                    start = time.perf_counter()
                    generate(decoder, features, config)
                    times[name].append(time.perf_counter() - start)
            w, wo = statistics.median(times["with"]), statistics.median(times["without"])
            print(f"{beams} beam(s): with the self view {w:.3f} s, without {wo:.3f} s, ratio {w / wo:.3f}")
    finally:
        TransformerDecoder.step = with_view


if __name__ == "__main__":
    main()
