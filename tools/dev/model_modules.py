"""Which modules of captioning/models/ run when the demo's model trains a step and decodes greedily.

    python -m tools.dev.model_modules                      # the demo's soft model (configs/shapes_soft.yaml)
    python -m tools.dev.model_modules --config configs/shapes_hard.yaml

The model is the config's, at its sizes, with a vocabulary of 40 words: one teacher-forced pass
``model(features, captions, lengths)`` with the objective's loss and its backward pass, then
``model.generate(images=...)``. Every Python function called is recorded (sys.setprofile); the
report lists the modules of captioning/models/ whose code ran (the encoder's module aside, as its
own part) and their lines. It exits 1 when more than ``--max-modules`` modules or more than
``--max-lines`` lines of them ran (the reader's budget: the decoder's module and the captioner's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "captioning" / "models"
ENCODER = MODELS / "encoders.py"


def modules_run(config: Path) -> list[Path]:
    """The files of captioning/models/ (the encoder's aside) that run in one training step and one greedy decode."""
    from captioning.decoding.generation import GenerationConfig
    from captioning.models.encoders import EncoderConfig
    from captioning.models.kinds import decoder_config
    from captioning.models.spec import ModelSpec, build_model
    from captioning.objectives import objective_from_spec
    from captioning.vocab import Vocabulary

    settings = yaml.safe_load(config.read_text())
    model_cfg, size = settings["model"], settings.get("data", {}).get("image_size", 64)
    vocab = Vocabulary(list(Vocabulary.SPECIALS) + [f"w{i}" for i in range(36)])
    spec = ModelSpec(EncoderConfig(**model_cfg["encoder"]), decoder_config(model_cfg["decoder"]), size)
    torch.manual_seed(0)
    model = build_model(spec, vocab)
    objective = objective_from_spec(model_cfg["objective"])
    images = torch.rand(4, 3, size, size)
    captions = torch.randint(4, len(vocab), (4, 9))
    captions[:, 0], captions[:, -1] = Vocabulary.bos_id, Vocabulary.eos_id
    batch = {"images": images, "captions": captions, "lengths": torch.full((4,), 9)}
    features = model.features(batch)
    ran: set[str] = set()

    def record(frame, event, arg):
        if event == "call":
            ran.add(frame.f_code.co_filename)

    sys.setprofile(record)
    try:
        objective(model, features.detach(), batch).loss.backward()
        model.eval()
        model.generate(features=features.detach(), config=GenerationConfig(max_new_tokens=8))
    finally:
        sys.setprofile(None)
    files = {Path(f).resolve() for f in ran}
    return sorted(f for f in files if MODELS in f.parents and f != ENCODER)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "shapes_soft.yaml")
    parser.add_argument("--max-modules", type=int, default=2)
    parser.add_argument("--max-lines", type=int, default=650)
    args = parser.parse_args(argv)
    files = modules_run(args.config)
    lines = {f: len(f.read_text().splitlines()) for f in files}
    for f, n in lines.items():
        print(f"{f.relative_to(ROOT)}: {n} lines")
    total = sum(lines.values())
    print(f"{len(files)} module(s) of captioning/models/ ran, {total} lines")
    if len(files) > args.max_modules or total > args.max_lines:
        print(f"more than {args.max_modules} modules or {args.max_lines} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
