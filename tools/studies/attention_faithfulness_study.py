"""Issue 45's measurements: faithfulness areas, steering success and novel-pair recall per model.

    python -m tools.studies.attention_faithfulness_study measure NAME=CKPT ... --data DATA.json --out DIR
        for each checkpoint: `evaluate --faithfulness` on the test split (its test decoding, over
        --faithfulness-images images), the held-out pairs of the test_novel split (data made with
        make-shapes --holdout), and steering: every two-object test image captioned with the box of
        each of its objects as --focus (strength --strength) and without: how often the caption
        names the focused object, and how often the other one. DIR/NAME.json per model.
    python -m tools.studies.attention_faithfulness_study steer NAME=CKPT --data DATA.json --out DIR --strengths S...
        steering alone at several strengths: DIR/NAME_steer.json and a table row per strength
    python -m tools.studies.attention_faithfulness_study table DIR
        the table of docs/studies/ATTENTION_FAITHFULNESS.md from every DIR/*.json

A caption names an object when it mentions its full (size, colour, shape) triple.
"""

from __future__ import annotations

import argparse
import glob
import json
import os


def steering(captioner, data_path: str, strength: float, generation: dict) -> dict:
    """Steering success on the two-object test images: per object box, whether the focused caption
    names it and whether it names the other object; the same without focus."""
    from tqdm import tqdm

    from captioning.data.shapes import parse_objects

    with open(data_path, encoding="utf-8") as f:
        images = [i for i in json.load(f)["images"] if i["split"] == "test" and len(i["objects"]) == 2]
    root = os.path.dirname(data_path)
    counts = {"cases": 0, "names_focused": 0, "names_other": 0, "names_only_focused": 0}
    plain = {"names_focused": 0, "names_other": 0}
    for image in tqdm(images, desc="steering", unit="img"):
        path = os.path.join(root, image["filepath"], image["filename"])
        base = set(parse_objects(captioner([path], **generation)[0]["generated_text"]))
        boxes = [o["bbox"] for o in image["objects"]]
        steered = captioner([path] * 2, focus=boxes, focus_strength=strength, **generation)
        for k, obj in enumerate(image["objects"]):
            this, other = tuple(obj["words"]), tuple(image["objects"][1 - k]["words"])
            if this == other:
                continue  # two objects of the same triple: naming one names the other
            said = set(parse_objects(steered[k]["generated_text"]))
            counts["cases"] += 1
            counts["names_focused"] += this in said
            counts["names_other"] += other in said
            counts["names_only_focused"] += this in said and other not in said
            plain["names_focused"] += this in base
            plain["names_other"] += other in base
    n = max(counts["cases"], 1)
    return {
        "images": len(images),
        "strength": strength,
        **counts,
        "named_focused": counts["names_focused"] / n,
        "named_other": counts["names_other"] / n,
        "named_only_focused": counts["names_only_focused"] / n,
        "unsteered_named_focused": plain["names_focused"] / n,
        "unsteered_named_other": plain["names_other"] / n,
    }


def measure(args) -> None:
    from captioning.api import Captioner
    from captioning.cli.evaluate import evaluate
    from captioning.storage.load import load_model

    os.makedirs(args.out, exist_ok=True)
    for item in args.checkpoints:
        name, _, path = item.partition("=")
        model = load_model(path)
        generation = model.spec.generation.replace(num_beams=args.beams)
        report = evaluate(
            model,
            args.data,
            split="test",
            generation=generation,
            faithfulness=True,
            faithfulness_images=args.faithfulness_images,
            metrics=("BLEU", "CIDEr"),
            tokenizer="python",
        )
        captioner = Captioner.from_model(model, device="cpu")
        result = {
            "name": name,
            "checkpoint": path,
            "attention_kind": model.attention_kind,
            "global_step": (model.card or {}).get("global_step"),
            "scores": report["scores"],
            "novel_pairs": report.get("novel_pairs"),
            "faithfulness": report["faithfulness"],
            "steering": steering(captioner, args.data, args.strength, {"num_beams": args.beams}),
        }
        with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({k: result[k] for k in ("name", "steering")}, indent=1))


def steer(args) -> None:
    from captioning.api import Captioner
    from captioning.storage.load import load_model

    os.makedirs(args.out, exist_ok=True)
    name, _, path = args.checkpoint.partition("=")
    model = load_model(path)
    captioner = Captioner.from_model(model, device="cpu")
    rows = [steering(captioner, args.data, s, {"num_beams": args.beams}) for s in args.strengths]
    with open(os.path.join(args.out, f"{name}_steer.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    print("| model | strength | names the focused object | names the other | names only the focused |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {name} | {r['strength']:g} | {100 * r['named_focused']:.0f}% | {100 * r['named_other']:.0f}% | "
            f"{100 * r['named_only_focused']:.0f}% |"
        )


def table(args) -> None:
    rows = []
    for path in sorted(glob.glob(os.path.join(args.dir, "*.json"))):
        if path.endswith("_steer.json"):
            continue
        with open(path, encoding="utf-8") as f:
            r = json.load(f)
        areas = {m: r["faithfulness"]["removal"][m] for m in ("mean", "zero")}
        novel = r.get("novel_pairs") or {}
        s = r["steering"]

        def area(m, cls, key):
            return f"{areas[m][cls]['area'][key]:.3f}" if cls in areas[m] else "-"

        rows.append(
            f"| {r['name']} | {r.get('global_step') or '-'} | {r['scores'].get('object_f1', float('nan')):.3f} | "
            f"{area('mean', 'object', 'deletion_top')} / {area('mean', 'object', 'deletion_random')} | "
            f"{area('mean', 'function', 'deletion_top')} / {area('mean', 'function', 'deletion_random')} | "
            f"{area('zero', 'object', 'deletion_top')} / {area('zero', 'object', 'deletion_random')} | "
            f"{area('mean', 'all', 'insertion_top')} / {area('mean', 'all', 'insertion_random')} | "
            f"{100 * s['named_focused']:.0f}% / {100 * s['named_other']:.0f}% "
            f"({100 * s['unsteered_named_focused']:.0f}% / {100 * s['unsteered_named_other']:.0f}%) | "
            f"{novel.get('recall', float('nan')):.3f} |"
        )
    print(
        "| model | steps | test object F1 | deletion area, object words: top / random (mean removal) | "
        "function words: top / random | object words, zero removal: top / random | "
        "insertion area, all words: top / random | focus: names focused / other (unsteered) | novel-pair recall |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("checkpoints", nargs="+", metavar="NAME=CKPT")
    m.add_argument("--data", required=True, help="shapes data made with make-shapes --holdout")
    m.add_argument("--out", required=True)
    m.add_argument("--beams", type=int, default=3)
    m.add_argument("--strength", type=float, default=10.0)
    m.add_argument("--faithfulness-images", type=int, default=150)
    st = sub.add_parser("steer")
    st.add_argument("checkpoint", metavar="NAME=CKPT")
    st.add_argument("--data", required=True)
    st.add_argument("--out", required=True)
    st.add_argument("--beams", type=int, default=3)
    st.add_argument("--strengths", type=float, nargs="+", default=[0.5, 1, 2, 3, 5, 10])
    t = sub.add_parser("table")
    t.add_argument("dir")
    args = p.parse_args()
    {"measure": measure, "steer": steer, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
