"""Training step time and beam-search images/s of the LSTM and the Transformer decoder, in one
process, the two timed in alternation (so that a busy machine slows both alike; compare ratios).

    python -m tools.studies.transformer_speed                  # the shapes configs' decoders on features
    python -m tools.studies.transformer_speed --coco           # COCO's sizes: V=10,000, 14x14x2048, beam 5

Decoders only, on random annotation vectors (the encoder is the same for both kinds): a training
step is the teacher-forced pass, the cross-entropy and its backward and an Adam step, on captions of
``--length`` tokens; decoding is beam search of ``--max-new-tokens`` steps (no early stop: the
captions of an untrained model do not end, so every step is timed).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from captioning.decoding.generation import GenerationConfig
from captioning.decoding.search import generate
from captioning.models.decoder import DecoderConfig, build_decoder

SHAPES = {
    "lstm": DecoderConfig(embed_dim=128, hidden_dim=256, attention_dim=128, dropout=0.1),
    "transformer2": DecoderConfig(kind="transformer", embed_dim=128, hidden_dim=128, heads=4, layers=2, dropout=0.1),
    "transformer3": DecoderConfig(kind="transformer", embed_dim=128, hidden_dim=128, heads=4, layers=3, dropout=0.1),
}
COCO = {
    "lstm": DecoderConfig(),  # the paper's: 512 / 512 / 512
    "transformer3": DecoderConfig(kind="transformer", heads=8, layers=3, dropout=0.1),
    "transformer6": DecoderConfig(kind="transformer", heads=8, layers=6, dropout=0.1),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coco", action="store_true", help="COCO's sizes (V=10,000, 14x14x2048, beam 5)")
    p.add_argument("--batch", type=int, default=None, help="captions per training step (default 96; COCO 32)")
    p.add_argument("--images", type=int, default=None, help="images per beam search (default 96; COCO 8)")
    p.add_argument("--length", type=int, default=None, help="tokens per caption (default 14; COCO 18)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="decoding steps (default 14; COCO 18)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats of each (after one warm-up)")
    args = p.parse_args()
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
        loss = F.cross_entropy(out.logits, captions[:, 1:][out.mask])
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
