"""The decoding options and checkpoint ensembles against plain beam search, on one split: the table of
docs/studies/DECODING.md.

    python -m tools.studies.decoding_study --annotations DATA.json --checkpoint A.ckpt --checkpoint B.ckpt \
        [--checkpoint C.ckpt] [--split test] [--label "demo, soft"] [--out rows.json] [--rows beam3 ngram3 ...]

Each row decodes the split with the first checkpoint (the ``member`` rows: each checkpoint alone, the
``ensemble`` row: all of them, decoding/ensemble.py) and scores it with the Evaluator that validation,
``captioning test`` and ``captioning evaluate`` use: object F1 (the shapes data), CIDEr (Python PTB
tokens), distinct-2. Speed: images per second of the decoding itself (the encoder and the search),
batches of ``--batch-size`` (64) images already in memory, on the threads ``--threads`` allows,
the fastest of ``--rounds`` (3) rounds in which the rows take turns; the table gives each row's
ratio to the beam-3 row (the ensemble's: to its first member's row). The split's images are read
once, before any row. Sampling rows draw from ``torch.manual_seed(--seed)``.

Prints a Markdown table (and writes the rows as JSON with ``--out``); ``--markdown-only`` leaves out
the progress lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

#: row name -> (what the table calls it, GenerationConfig fields over the model's test decoding)
ROWS = {
    "beam3": ("beam 3 (the baseline)", dict(num_beams=3)),
    "greedy": ("greedy", dict(num_beams=1)),
    "diverse3x1": (
        "diverse beams, 3 groups x 1 beam, penalty 0.5",
        dict(num_beams=3, num_beam_groups=3, diversity_penalty=0.5),
    ),
    "diverse3x2": (
        "diverse beams, 3 groups x 2 beams, penalty 0.5",
        dict(num_beams=6, num_beam_groups=3, diversity_penalty=0.5),
    ),
    "ngram3": ("beam 3, no_repeat_ngram_size 3", dict(num_beams=3, no_repeat_ngram_size=3)),
    "repetition1.2": ("beam 3, repetition_penalty 1.2", dict(num_beams=3, repetition_penalty=1.2)),
    "min_tokens8": ("beam 3, min_new_tokens 8", dict(num_beams=3, min_new_tokens=8)),
    "suppress_unk": ("beam 3, suppress_tokens <unk>", dict(num_beams=3, suppress_tokens=("<unk>",))),
    "top_p0.9": ("sampling, top_p 0.9", dict(num_beams=1, do_sample=True, top_p=0.9)),
    "members": ("each checkpoint alone, beam 3", dict(num_beams=3)),
    "ensemble": ("ensemble of the checkpoints, beam 3", dict(num_beams=3)),
}


def load_split(annotations: str, split: str, image_size: int, vocab, batch_size: int, limit: int | None):
    """(the CaptionData, its batches of ``split`` in memory): images read and resized once."""
    from captioning.data.captions import CaptionData

    data = CaptionData(
        annotations, eval_batch_size=batch_size, num_workers=0, image_size=image_size, on_bad_image="skip"
    )
    data.set_vocab(vocab)
    batches, count = [], 0
    for batch in data.eval_dataloader(split):
        batch.pop("bad_images", None)
        if limit is not None:
            batch = {k: v[: limit - count] for k, v in batch.items()}
        if batch["image_ids"].numel():
            batches.append(batch)
            count += int(batch["image_ids"].numel())
        if limit is not None and count >= limit:
            break
    return data, batches


def scores_of(model, data, batches, split: str, generation, seed: int, novel) -> dict:
    """One row's scores: the split decoded with ``generation`` and scored."""
    import torch

    from captioning.evaluation.evaluator import Evaluator

    evaluator = Evaluator(("CIDEr",), tokenizer="python")
    evaluator.set_training_captions(known=novel)
    torch.manual_seed(seed)
    for batch in batches:
        evaluator.add(model, batch, generation)
    predictions = evaluator.predictions(model.vocab)
    try:
        scores, _ = evaluator.score(predictions, data.references(split), data, split)
    finally:
        evaluator.close()
    return {
        "images": len(predictions),
        "object_f1": scores.get("object_f1"),
        "CIDEr": scores.get("CIDEr"),
        "distinct_2": scores.get("distinct_2"),
        "novel_captions": scores.get("novel_captions"),
        "mean_length": scores.get("mean_length"),
    }


def seconds_of(model, batches, generation) -> float:
    """The time to decode (encode and search) every batch once."""
    import torch

    config = generation.resolve_tokens(model.vocab)
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            model.generate(features=model.features(batch), config=config)
    return time.perf_counter() - start


def run(
    annotations: str,
    checkpoints: list[str],
    split: str = "test",
    rows=tuple(ROWS),
    batch_size: int = 64,
    seed: int = 0,
    limit: int | None = None,
    label: str = "",
    rounds: int = 3,
    progress=print,
) -> list[dict]:
    """The table's rows (dicts: label, row, what, model, the generation fields and the measures).

    Each row is decoded and scored once; then timed ``rounds`` times, the rows taking turns in each
    round (a warm-up batch first), and its speed is from its fastest round: other jobs on the
    machine only ever slow a round down."""
    from captioning.decoding.ensemble import Ensemble, short_names
    from captioning.evaluation.split_scores import known_training_captions
    from captioning.storage.load import load_model

    models = [load_model(p).eval() for p in checkpoints]
    first = models[0]
    data, batches = load_split(
        annotations, split, max(int(m.spec.image_size) for m in models), first.vocab, batch_size, limit
    )
    novel = known_training_captions(data)
    names = short_names(checkpoints)
    todo = []  # (row, model, generation)
    for name in rows:
        what, fields = ROWS[name]
        if name == "ensemble" and len(models) < 2:
            continue
        if name == "members":
            runs = list(zip(names, models))
        elif name == "ensemble":
            runs = [(" + ".join(names), Ensemble(models, names=checkpoints).eval())]
        else:
            runs = [(names[0], first)]
        for model_name, model in runs:
            generation = first.spec.generation.replace(**fields)
            row = {
                "label": label,
                "row": name,
                "what": what,
                "model": model_name,
                "generation": fields,
                **scores_of(model, data, batches, split, generation, seed, novel),
            }
            todo.append((row, model, generation))
    for _ in range(rounds):
        for row, model, generation in todo:
            seconds_of(model, batches[:1], generation)  # warm-up
            seconds = seconds_of(model, batches, generation)
            row["seconds"] = min(row.get("seconds", seconds), seconds)
    out = []
    for row, _, _ in todo:
        row["images_per_s"] = row["images"] / row["seconds"]
        progress(json.dumps(row))
        out.append(row)
    return out


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table: figures to 3 decimals, speed as images/s and x the baseline's."""
    lines = [
        "| data, attention | decoding | model | object F1 | CIDEr | distinct-2 | images/s |",
        "|---|---|---|---|---|---|---|",
    ]
    base = {r["label"]: r["images_per_s"] for r in rows if r["row"] == "beam3"}
    first_member = {}  # the ensemble's speed is against its first member's, decoded in the same run
    for r in rows:
        if r["row"] == "members":
            first_member.setdefault(r["label"], r["images_per_s"])

    def num(v) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        speed = f"{r['images_per_s']:.0f}"
        against = first_member if r["row"] == "ensemble" else base
        if r["label"] in against and r["row"] not in ("beam3", "members"):
            speed += f" ({r['images_per_s'] / against[r['label']]:.2f}x)"
        lines.append(
            f"| {r['label']} | {r['what']} | {r['model']} | {num(r['object_f1'])} | {num(r['CIDEr'])} | "
            f"{num(r['distinct_2'])} | {speed} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--annotations", required=True, help="the data set's annotation file")
    p.add_argument(
        "--checkpoint",
        action="append",
        required=True,
        help="a checkpoint or model folder (repeat: the ensemble row uses every one; the first decodes the option rows)",
    )
    p.add_argument("--split", default="test")
    p.add_argument(
        "--rows", nargs="+", choices=list(ROWS), default=list(ROWS), help="the rows to measure, in this order"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, help="only the split's first N images")
    p.add_argument("--seed", type=int, default=0, help="the sampling rows' seed")
    p.add_argument(
        "--rounds", type=int, default=3, help="timing rounds (the rows take turns; each row's fastest counts)"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch's CPU threads (default 1: comparable on a shared machine)"
    )
    p.add_argument("--label", default="", help="the table's first column, e.g. 'demo, soft'")
    p.add_argument("--out", default=None, help="write the rows as JSON here (appended to the file's rows if it exists)")
    p.add_argument("--markdown-only", action="store_true", help="print the table only")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rows = run(
        args.annotations,
        args.checkpoint,
        args.split,
        args.rows,
        args.batch_size,
        args.seed,
        args.limit,
        args.label,
        args.rounds,
        progress=(lambda line: None) if args.markdown_only else (lambda line: print(line, file=sys.stderr)),
    )
    if args.out:
        before = json.load(open(args.out)) if os.path.isfile(args.out) else []
        with open(args.out, "w") as f:
            json.dump(before + rows, f, indent=1)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
