"""``captioning compare A B``: is system A better than system B, and by how much, with a 95% interval?

    captioning compare a_results.json b_results.json --annotations dataset_coco.json [--instances FILE]
    captioning compare a_seed0.ckpt,a_seed1.ckpt b_seed0.ckpt,b_seed1.ckpt --annotations ... --report DIR

A side is a COCO results file or a checkpoint (decoded on the split first), or several of them
separated by commas (one per seed). Both sides are scored by ``captioning score``'s path, then per
metric: A's and B's score, the difference, its paired-bootstrap interval over the images (and the
seeds) and the approximate-randomisation p-value (metrics/bootstrap.py; docs/EVALUATION.md says how
each corpus metric is resampled). Only the images every run captioned are compared.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
from pathlib import Path

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least, generation_args
from captioning.errors import ConfigError


def side_paths(side: str, name: str) -> list[str]:
    """The runs of a side: ``A1,A2,A3`` -> [A1, A2, A3]; one line if one is not there."""
    paths = [p for p in side.split(",") if p]
    if not paths:
        raise ConfigError(f"{name}: expected a results file or checkpoint, or several separated by commas")
    for p in paths:
        if not os.path.exists(p):
            raise ConfigError(f"{name}: {p}: no such results file, checkpoint or model folder")
    return paths


def is_results_file(path: str) -> bool:
    return path.endswith(".json") and os.path.isfile(path)


def run_captions(
    path: str, annotations, images_root, split, generation_args_: argparse.Namespace | None, names=None, **decode
):
    """({image id: caption}, the model or None) of one run: a results file read, or a checkpoint's captions
    of the split; the images named as a results file names them (the dataset's own ids: ``names``)."""
    from captioning.evaluation.results_files import read_results

    if is_results_file(path):
        return read_results(path), None
    from captioning.cli.evaluate import evaluate
    from captioning.cli.options import check_generation_flags
    from captioning.storage.load import load_model

    model = load_model(path)
    generation = (
        check_generation_flags(generation_args_, model.spec.generation) if generation_args_ else model.spec.generation
    )
    report = evaluate(
        model,
        annotations,
        images_root=images_root,
        split=split,
        generation=generation,
        metrics=("BLEU",),
        tokenizer="python",
        checkpoint=path,
        **decode,
    )
    names = names or {}
    return {names.get(i, i): c for i, c in report["predictions"].items()}, model


def compare_runs(
    a: list[str],
    b: list[str],
    annotations,
    images_root: str | None = None,
    split: str = "test",
    instances: str | None = None,
    resamples: int = 1000,
    seed: int = 0,
    metrics=None,
    tokenizer: str = "auto",
    generation: argparse.Namespace | None = None,
    progress=print,
    **decode,
) -> dict:
    """The comparison of runs ``a`` against runs ``b`` (results files or checkpoints; several are
    seeds): {"scores": {metric: {"a", "b", "difference", "ci_low", "ci_high", "p_value"}}, "a", "b",
    "split", "num_images", "resamples", "seed", "coverage"} plus, not for the JSON file, "runs":
    per side a list of (path, captions, SplitScores, model or None)."""
    from captioning.cli.score import score_results
    from captioning.data.captions import CaptionData
    from captioning.evaluation.results_files import cover_split, dataset_ids
    from captioning.metrics.bootstrap import compare_statistics
    from captioning.metrics.chair import read_instances

    if resamples < 1:
        raise ConfigError(f"--resamples: expected at least 1, got {resamples}")
    objects = read_instances(instances) if instances else None
    data = CaptionData(annotations, images_root)
    references, names = data.references(split), dataset_ids(data)
    captions = {}
    for path in dict.fromkeys(a + b):
        progress(f"captions of {path}")
        got, model = run_captions(path, annotations, images_root, split, generation, names, **decode)
        kept, lines = cover_split(got, references, path, split, names)
        captions[path] = (kept, model, lines)
    coverage = [line for _, _, lines in captions.values() for line in lines]
    common = set(references)
    for kept, _, _ in captions.values():
        common &= set(kept)
    ids = sorted(common)
    scored = {}
    for path, (got, model, _) in captions.items():
        progress(f"scoring {path} on {len(ids)} images")
        report = score_results(
            path,
            annotations,
            images_root,
            split,
            instances=objects,
            metrics=metrics,
            tokenizer=tokenizer,
            predictions={names.get(i, i): got[i] for i in ids},
        )
        scored[path] = (path, report["predictions"], report["scored"], model)
    stats = {path: s[2].statistics() for path, s in scored.items()}
    progress(f"resampling {len(ids)} images {resamples} times")
    table = compare_statistics([stats[p] for p in a], [stats[p] for p in b], resamples, seed)
    return {
        "scores": table,
        "a": a,
        "b": b,
        "split": split,
        "num_images": len(ids),
        "resamples": resamples,
        "seed": seed,
        "coverage": coverage,
        "runs": {"a": [scored[p] for p in a], "b": [scored[p] for p in b]},
    }


def format_table(scores: dict) -> str:
    """The comparison as aligned text: metric, a, b, difference, 95% interval, p."""
    lines = [f"{'metric':<22}{'A':>9}{'B':>9}{'A - B':>10}   {'95% interval':<22}{'p':>7}"]
    for name, s in scores.items():
        interval = f"[{s['ci_low']:+.4f}, {s['ci_high']:+.4f}]"
        lines.append(
            f"{name:<22}{s['a']:>9.4f}{s['b']:>9.4f}{s['difference']:>+10.4f}   {interval:<22}{s['p_value']:>7.3f}"
        )
    return "\n".join(lines)


def md_text(text) -> str:
    """A caption, reference or name as Markdown text: one line, its HTML escaped (report.md carries no
    markup of a caption's, as index.html does not) and Markdown's link, image and emphasis characters
    escaped (a caption cannot add a picture or a link to the report)."""
    text = html.escape(" ".join(str(text).split()), quote=False)
    return "".join("\\" + ch if ch in "\\`*_[]()#!|~" else ch for ch in text)


def check_outputs(out: str | None, report: str | None) -> None:
    """``--out`` and ``--report``, checked before any scoring: a file where a folder should be (or
    the reverse), a folder that cannot be made, a symbolic link: one line, not a traceback at the end."""
    from captioning.files import refuse_link

    if out is not None:
        refuse_link(out, ConfigError, "--out")
        if os.path.isdir(out):
            raise ConfigError(f"--out {out}: a folder; give the JSON file to write (e.g. comparison.json)")
        parent = os.path.dirname(os.path.abspath(out))
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise ConfigError(f"--out {out}: {parent} is a file, not a folder")
    if report is not None:
        refuse_link(report, ConfigError, "--report")
        if os.path.exists(report) and not os.path.isdir(report):
            raise ConfigError(
                f"--report {report}: a file; --report names the folder to write report.md and index.html in"
            )
        parent = os.path.dirname(os.path.abspath(report))
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise ConfigError(f"--report {report}: {parent} is a file, not a folder")
        images = os.path.join(report, "images")
        refuse_link(images, ConfigError, "--report's images folder")
        if os.path.exists(images) and not os.path.isdir(images):
            raise ConfigError(f"--report {report}: {images} is a file, not the report's images folder")


def write_report(out: str, comparison: dict, data, split: str, top: int = 10, gifs: bool = True) -> Path:
    """``out``/report.md and ``out``/index.html: the comparison's table and the ``top`` images whose
    CIDEr-D differs most between A and B (the sides' first runs), with both captions, the references
    and the image (and both attention GIFs when the runs are checkpoints). Returns the HTML's path.

    A new folder is written whole in a temporary sibling and renamed into place; in an existing one
    each file is replaced atomically: a symbolic link there (index.html, images/N.jpg) is replaced,
    never written through, and an ``images`` that is a link is refused (files.py: folder_writer)."""
    import io

    import numpy as np

    from captioning.files import atomic_write_bytes, atomic_write_text, folder_writer, refuse_link

    check_outputs(None, out)
    (path_a, caps_a, scored_a, model_a) = comparison["runs"]["a"][0]
    (path_b, caps_b, scored_b, model_b) = comparison["runs"]["b"][0]

    def cider(side) -> np.ndarray:  # (N,) the side's mean per-image CIDEr-D over its runs
        return np.mean([run[2].per_image["CIDEr"] for run in comparison["runs"][side]], axis=0)

    ids = scored_a.per_image["ids"]
    if "CIDEr" not in scored_a.per_image:
        raise ConfigError("--report ranks the images by CIDEr-D: keep CIDEr among the metrics")
    ca, cb = cider("a"), cider("b")
    order = np.argsort(-np.abs(ca - cb), kind="stable")[:top]
    records = {r.image_id: r for r in data.records(split)}
    references = data.references(split)
    with folder_writer(out, ConfigError, "the report folder") as folder:
        refuse_link(folder / "images", ConfigError, "the report's images folder")
        (folder / "images").mkdir(exist_ok=True)
        items = []
        for k in order:
            i = ids[k]
            entry = {"image_id": i, "a": caps_a[i], "b": caps_b[i], "cider_a": float(ca[k]), "cider_b": float(cb[k])}
            entry["name"] = (scored_a.names or {}).get(i, i)  # the dataset's own id (AI Challenger: the file name)
            entry["references"] = references[i]
            try:
                image = data.read_image(records[i]).convert("RGB")
                image.thumbnail((320, 320))
                jpeg = io.BytesIO()
                image.save(jpeg, format="JPEG", quality=90)
                atomic_write_bytes(folder / "images" / f"{i}.jpg", jpeg.getvalue())
                entry["image"] = f"images/{i}.jpg"
            except Exception as err:  # an unreadable image: the report says so and goes on
                entry["image_error"] = str(err)
            for side, model in (("a", model_a), ("b", model_b)):
                if gifs and model is not None and "image" in entry:
                    entry[f"gif_{side}"] = _attention_gif(
                        model, data, records[i], folder / "images" / f"{i}_{side}.gif"
                    )
            items.append(entry)
        atomic_write_text(folder / "report.md", _markdown(comparison, items, split))
        atomic_write_text(folder / "index.html", _page(comparison, items, split))
    return Path(out) / "index.html"


def _markdown(comparison: dict, items: list[dict], split: str) -> str:
    """report.md: the table and the images, every text from the runs and the data escaped (:func:`md_text`)."""
    labels = (", ".join(comparison["a"]), ", ".join(comparison["b"]))
    md = [
        f"# {md_text(labels[0])} (A) against {md_text(labels[1])} (B)",
        "",
        f"Split {md_text(split)}, {comparison['num_images']} images; {comparison['resamples']} paired resamples "
        f"(seed {comparison['seed']}); intervals 95%, percentile bootstrap; p: approximate randomisation.",
        "",
        "| metric | A | B | A - B | 95% interval | p |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in comparison["scores"].items():
        md.append(
            f"| {md_text(name)} | {s['a']:.4f} | {s['b']:.4f} | {s['difference']:+.4f} | "
            f"[{s['ci_low']:+.4f}, {s['ci_high']:+.4f}] | {s['p_value']:.3f} |"
        )
    md += ["", f"## The {len(items)} images where A and B differ most in CIDEr-D", ""]
    for e in items:
        md += [f"### image {md_text(e['name'])}: CIDEr-D A {e['cider_a']:.3f}, B {e['cider_b']:.3f}", ""]
        if "image" in e:
            md += [f"![image {md_text(e['name'])}]({e['image']})", ""]
        md += [f"- **A**: {md_text(e['a'])}", f"- **B**: {md_text(e['b'])}"]
        md += [f"- reference: {md_text(r)}" for r in e["references"]]
        md += [f"- attention of {s.upper()}: ![{s}]({e[f'gif_{s}']})" for s in "ab" if e.get(f"gif_{s}")]
        md.append("")
    return "\n".join(md)


def _page(comparison: dict, items: list[dict], split: str) -> str:
    """index.html: the table and the images, every text escaped."""
    esc = html.escape
    labels = (", ".join(comparison["a"]), ", ".join(comparison["b"]))
    rows = "".join(
        f"<tr><td>{esc(n)}</td><td>{s['a']:.4f}</td><td>{s['b']:.4f}</td><td>{s['difference']:+.4f}</td>"
        f"<td>[{s['ci_low']:+.4f}, {s['ci_high']:+.4f}]</td><td>{s['p_value']:.3f}</td></tr>"
        for n, s in comparison["scores"].items()
    )
    cards = []
    for e in items:
        pictures = "".join(f'<img src="{esc(e[k])}" alt="{esc(k)}">' for k in ("image", "gif_a", "gif_b") if e.get(k))
        refs = "".join(f"<li>{esc(r)}</li>" for r in e["references"])
        cards.append(
            f"<section><h3>image {esc(str(e['name']))}: CIDEr-D A {e['cider_a']:.3f}, B {e['cider_b']:.3f}</h3>"
            f"<div>{pictures}</div><p><b>A</b>: {esc(e['a'])}<br><b>B</b>: {esc(e['b'])}</p>"
            f"<ul>{refs}</ul></section>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>captioning compare</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}td,th{padding:0 .6em;text-align:right}"
        "td:first-child{text-align:left}img{margin-right:.5em;max-height:240px}</style></head><body>"
        f"<h1>{esc(labels[0])} (A) against {esc(labels[1])} (B)</h1>"
        f"<p>Split {esc(split)!s}, {comparison['num_images']} images; {comparison['resamples']} paired resamples "
        f"(seed {comparison['seed']}); 95% percentile intervals; p: approximate randomisation.</p>"
        "<table><tr><th>metric</th><th>A</th><th>B</th><th>A - B</th><th>95% interval</th><th>p</th></tr>"
        f"{rows}</table><h2>The images where A and B differ most in CIDEr-D</h2>{''.join(cards)}</body></html>"
    )


def _attention_gif(model, data, record, path: Path) -> str | None:
    """The model's attention GIF of one image (as ``captioning attend`` draws it, written atomically:
    a link at ``path`` is replaced, not followed), or None."""
    from captioning.api import Captioner

    image_path = os.path.join(data.images_root, record.path)
    if not os.path.isfile(image_path):
        return None
    captioner = Captioner.from_model(model, device="cpu")
    result = captioner([image_path], return_attention=True)[0]
    captioner.render(image_path, result, path, format="gif")  # viz/pictures.py: save_frames, atomic
    return f"images/{path.name}"


@COMMANDS.register("compare")
class Compare(Command):
    help = "compare two systems' captions: differences with bootstrap intervals and p-values"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("a", metavar="A", help="results file or checkpoint; several seeds as A1,A2,A3")
        p.add_argument("b", metavar="B", help="results file or checkpoint; several seeds as B1,B2,B3")
        p.add_argument("--annotations", required=True, nargs="+", metavar="FILE", help="the split's annotation file(s)")
        p.add_argument("--images-root", default=None, help="folder the image paths are relative to")
        p.add_argument("--split", default="test")
        p.add_argument("--instances", default=None, metavar="FILE", help="COCO instances file: compare CHAIR too")
        p.add_argument("--resamples", type=at_least(1), default=1000, help="bootstrap and permutation draws")
        p.add_argument("--seed", type=int, default=0, help="the resampling's seed (the same seed, the same intervals)")
        p.add_argument("--out", default=None, metavar="FILE.json", help="write the comparison here")
        p.add_argument("--report", default=None, metavar="DIR", help="write report.md and index.html here")
        p.add_argument("--top", type=at_least(1), default=10, help="images in the report")
        p.add_argument("--batch-size", type=at_least(1), default=32, help="decoding batch (checkpoints)")
        generation_args(p, checkpoint=False)

    def run(self, args: argparse.Namespace) -> int:
        from captioning.data.captions import CaptionData
        from captioning.files import atomic_write_json

        annotations = args.annotations[0] if len(args.annotations) == 1 else args.annotations
        a, b = side_paths(args.a, "A"), side_paths(args.b, "B")
        check_outputs(args.out, args.report)  # before the scoring: a bad --out is one line, not a lost run
        comparison = compare_runs(
            a,
            b,
            annotations,
            args.images_root,
            args.split,
            instances=args.instances,
            resamples=args.resamples,
            seed=args.seed,
            generation=args,
            progress=lambda line: print(line, file=sys.stderr),
            batch_size=args.batch_size,
            device=args.device,
        )
        for line in comparison["coverage"]:
            print(line, file=sys.stderr)
        print(format_table(comparison["scores"]))
        if len(a) == 1 or len(b) == 1:
            print(
                "note: a side with one run: its interval covers the test images, not training seeds "
                "(give each side's seeds as A1,A2,A3; docs/EVALUATION.md)",
                file=sys.stderr,
            )
        if args.out:
            try:
                atomic_write_json(args.out, {k: v for k, v in comparison.items() if k != "runs"})
            except OSError as err:
                raise ConfigError(f"--out {args.out}: cannot write it ({err.strerror or err})") from None
        if args.report:
            page = write_report(
                args.report, comparison, CaptionData(annotations, args.images_root), args.split, args.top
            )
            print(f"wrote {page}", file=sys.stderr)
        return 0
