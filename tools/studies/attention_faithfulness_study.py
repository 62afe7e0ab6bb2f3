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
        the tables of docs/studies/ATTENTION_FAITHFULNESS.md (areas, novel pairs, deletion curves)
        from every DIR/*.json: models named
        NAME_sK (K a seed) are one row, the mean of their seeds, followed by a row per seed

A caption names an object when it mentions its full (size, colour, shape) triple.

Which maps: a multi-head model's are the mean of its heads (the decoder's ``alphas``, what
``attend`` draws by default); the faithfulness ranking and the steering read that mean map, and
the focus prior is added to every head's scores. A Transformer's are its first layer's
cross-attention, the mean of its heads (``attend``'s default, ``decoder.attention_layer``). A
model that cannot be steered (a decoder that refuses ``focus``) has its steering recorded as
unavailable, with the reason, and "-" in the table.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re


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


def maps_read(model) -> str:
    """Which attention maps the measurements read, in words (the JSON's ``maps``)."""
    config = model.decoder.config
    heads = int(getattr(config, "heads", 1) or 1)
    mean = f", the mean of its {heads} heads" if heads > 1 else ""
    if getattr(config, "kind", "lstm") == "transformer":
        layer = getattr(model.decoder, "attention_layer", 0)
        return (
            f"the layers' mean cross-attention{mean}" if layer == "mean" else f"layer {layer}'s cross-attention{mean}"
        )
    return ("one map per step" if heads == 1 else f"one map per step{mean}") + (
        ", local window" if getattr(config, "window", "global") == "local" else ""
    )


def steering_or_reason(captioner, data_path: str, strength: float, generation: dict) -> dict:
    """:func:`steering`, or ``{"unavailable": the one-line reason}`` for a model that refuses ``focus``."""
    from captioning.errors import ConfigError

    try:
        return steering(captioner, data_path, strength, generation)
    except ConfigError as err:
        return {"unavailable": str(err), "strength": strength}


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
            "decoder": getattr(model.decoder.config, "kind", "lstm"),
            "maps": maps_read(model),
            "global_step": (model.card or {}).get("global_step"),
            "scores": report["scores"],
            "novel_pairs": report.get("novel_pairs"),
            "faithfulness": report["faithfulness"],
            "steering": steering_or_reason(captioner, args.data, args.strength, {"num_beams": args.beams}),
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


SEEDED = re.compile(r"^(?P<model>.+)_s(?P<seed>\d+)$")


def _results(folder: str) -> dict[str, list[dict]]:
    """DIR/*.json grouped by model: NAME_sK files are seeds of NAME (in seed order); others alone."""
    groups: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        if path.endswith("_steer.json"):
            continue
        with open(path, encoding="utf-8") as f:
            r = json.load(f)
        seeded = SEEDED.match(r["name"])
        r["model"], r["seed"] = (seeded["model"], int(seeded["seed"])) if seeded else (r["name"], None)
        groups.setdefault(r["model"], []).append(r)
    for runs in groups.values():
        runs.sort(key=lambda r: -1 if r["seed"] is None else r["seed"])
    return groups


def _figures(r: dict) -> dict[str, float | None]:
    """The table's numbers of one measured model (None where it has none)."""
    removal = r["faithfulness"]["removal"]
    novel = r.get("novel_pairs") or {}
    s = r["steering"]

    def area(m, cls, key):
        return removal[m][cls]["area"][key] if cls in removal[m] else None

    steered = "unavailable" not in s
    return {
        "steps": r.get("global_step"),
        "f1": r["scores"].get("object_f1"),
        "del_obj_top": area("mean", "object", "deletion_top"),
        "del_obj_rand": area("mean", "object", "deletion_random"),
        "del_fn_top": area("mean", "function", "deletion_top"),
        "del_fn_rand": area("mean", "function", "deletion_random"),
        "zero_obj_top": area("zero", "object", "deletion_top"),
        "zero_obj_rand": area("zero", "object", "deletion_random"),
        "ins_top": area("mean", "all", "insertion_top"),
        "ins_rand": area("mean", "all", "insertion_random"),
        "focused": s["named_focused"] if steered else None,
        "other": s["named_other"] if steered else None,
        "plain_focused": s["unsteered_named_focused"] if steered else None,
        "plain_other": s["unsteered_named_other"] if steered else None,
        "novel": novel.get("recall"),
        "novel_f1": novel.get("object_f1"),
        "colour": sum((novel.get("substituted_colour") or {}).values()) if novel else None,
        "shape": sum((novel.get("substituted_shape") or {}).values()) if novel else None,
        "missed": novel.get("missed"),
        "novel_objects": novel.get("objects"),
    }


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _row(label: str, f: dict) -> str:
    def n(key, fmt="{:.3f}"):
        v = f[key]
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)

    def pct(key):
        return n(key, "{:.0%}")

    focus = (
        "-"
        if f["focused"] is None
        else f"{pct('focused')} / {pct('other')} ({pct('plain_focused')} / {pct('plain_other')})"
    )
    return (
        f"| {label} | {n('steps', '{:.0f}')} | {n('f1')} | {n('del_obj_top')} / {n('del_obj_rand')} | "
        f"{n('del_fn_top')} / {n('del_fn_rand')} | {n('zero_obj_top')} / {n('zero_obj_rand')} | "
        f"{n('ins_top')} / {n('ins_rand')} | {focus} | {n('novel')} |"
    )


def _novel_row(label: str, f: dict) -> str:
    def n(key, fmt="{:.3f}"):
        v = f[key]
        return "-" if v is None else fmt.format(v)

    def count(key):  # a seed's count, or the seeds' mean to one decimal
        return "-" if f[key] is None else f"{round(f[key], 1):g}"

    return (
        f"| {label} | {n('novel')} | {count('colour')} | {count('shape')} | {count('missed')} | "
        f"{count('novel_objects')} | {n('novel_f1')} ({n('f1')}) |"
    )


def table(args) -> None:
    groups = _results(args.dir)
    order = [m for m in args.order if m in groups] + sorted(m for m in groups if m not in args.order)
    main, novel = [], []
    for model in order:
        runs = groups[model]
        figures = [_figures(r) for r in runs]
        if len(runs) > 1:
            mean = {key: _mean([f[key] for f in figures]) for key in figures[0]}
            label = f"**{model}**, mean of {len(runs)}"
            main.append(_row(label, mean))
            novel.append(_novel_row(label, mean))
        for r, f in zip(runs, figures):
            label = model if r["seed"] is None else f"{model}, seed {r['seed']}"
            main.append(_row(label, f))
            novel.append(_novel_row(label, f))
    print(
        "| model | steps | test object F1 | deletion area, object words: top / random (mean removal) | "
        "function words: top / random | object words, zero removal: top / random | "
        "insertion area, all words: top / random | focus: names focused / other (unsteered) | novel-pair recall |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(main))
    print()
    print(
        "| model | novel-pair recall | colour substituted | shape substituted | missed | held-out objects | "
        "object F1 on test_novel (test) |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(novel))
    print()
    # the deletion curves of object and function words (mean removal), each model's mean over its seeds
    fractions = groups[order[0]][0]["faithfulness"]["fractions"] if order else []
    print("| model, words, removed | " + " | ".join(f"{f:.3g}" for f in fractions) + " |")
    print("|---|" + "---|" * len(fractions))
    for model in order:
        for cls in ("object", "function"):
            for which in ("top", "random"):
                curves = [
                    r["faithfulness"]["removal"]["mean"][cls]["deletion"][which]
                    for r in groups[model]
                    if cls in r["faithfulness"]["removal"]["mean"]
                ]
                if curves:
                    mean = [sum(c[k] for c in curves) / len(curves) for k in range(len(curves[0]))]
                    print(f"| {model}, {cls}, {which} | " + " | ".join(f"{v:.3f}" for v in mean) + " |")
    print()
    for model in order:  # which maps each model's rows read
        r = groups[model][0]
        extra = f"; steering: {r['steering']['unavailable']}" if "unavailable" in r["steering"] else ""
        print(f"- {model}: {r.get('maps', 'one map per step')}{extra}")


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
    t.add_argument(
        "--order",
        nargs="*",
        default=["soft", "hard", "dot", "general", "scaleddot", "multihead", "luong", "local", "refiner", "T2"],
        help="the models' row order (others follow by name)",
    )
    args = p.parse_args()
    {"measure": measure, "steer": steer, "table": table}[args.command](args)


if __name__ == "__main__":
    main()
