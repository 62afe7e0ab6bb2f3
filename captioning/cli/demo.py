"""The demo: shapes data -> soft-attention training on CPU -> test scores -> captions and GIFs.

``--language zh``: the same images with Chinese captions (make-shapes --language zh),
configs/shapes_soft_zh.yaml (jieba words, or one token per character without jieba), scores on
jieba words, pictures titled in a CJK font (docs/LANGUAGES.md).

Everything lands in one folder (default outputs/demo, outputs/demo_zh for Chinese):

    data/                 the generated shapes dataset (dataset_shapes.json + images/)
    train/                Lightning logs, config.yaml and checkpoints (best by validation CIDEr, last)
    metrics.json          test-split coco-caption scores and object F1 (beam search, 3 beams)
    curves.png            the training loss and validation scores against the step
    results.json          the test captions in the COCO results format
    captions.json         captions of a few test images
    attention/*.gif, *.png  where the model looked, one frame / panel per word
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from captioning.cli.commands import COMMANDS, Command
from captioning.cli.options import at_least, runnable, threads_arg
from captioning.errors import ConfigError

#: The demo's data: big enough to learn the task, small enough for a few CPU minutes.
DEMO_DATA = dict(n_train=2500, n_val=150, n_test=300, image_size=64)
#: The demo's training: a number of steps (instead of its config's time budget), so that its scores
#: are the same on any machine and only the time differs (docs/RESULTS.md, The demo)
DEMO_STEPS = 1200
#: Each language's config and output folder.
DEMO_CONFIGS = {"en": "shapes_soft.yaml", "zh": "shapes_soft_zh.yaml"}
DEMO_OUT = {"en": "outputs/demo", "zh": "outputs/demo_zh"}


def config_path(name: str) -> Path:
    """A config file of the repository's configs/ folder."""
    path = Path(__file__).resolve().parents[2] / "configs" / name  # captioning/cli/demo.py -> the repository
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found (the demo runs from a clone of the repository)")
    return path


def budget_args(steps: int | None = None, minutes: float | None = None, max_epochs: int | None = None) -> list[str]:
    """The fit options of the demo's training length: ``steps`` (default :data:`DEMO_STEPS`), or a
    time budget of ``minutes``, or ``max_epochs`` epochs."""
    if minutes is not None:
        seconds = round(minutes * 60)
        clock = f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
        return ["--trainer.max_steps", "-1", "--trainer.max_time", clock]
    if max_epochs is not None:
        return ["--trainer.max_time", "null", "--trainer.max_steps", "-1", "--trainer.max_epochs", str(max_epochs)]
    return ["--trainer.max_time", "null", "--trainer.max_steps", str(steps or DEMO_STEPS)]


def shortfall(steps: int, seconds: float, minutes: float | None) -> str | None:
    """One line when a time budget bought far fewer steps than the demo's recipe needs (under half
    of :data:`DEMO_STEPS`), with the remedy; None otherwise (or without a time budget)."""
    if minutes is None or steps >= DEMO_STEPS // 2:
        return None
    rate = steps / seconds if seconds > 0 else 0.0
    at_this_pace = f" (about {DEMO_STEPS / rate / 60:.0f} min at this pace)" if rate > 0 else ""
    return (
        f"note: {minutes:g} min bought {steps:,} training steps ({rate:.2f} steps/s): far fewer than the "
        f"{DEMO_STEPS:,} of the README's scores, so the model is undertrained; run "
        f"`{runnable()} demo --steps {DEMO_STEPS}`{at_this_pace}, with fewer other programs running"
    )


def run_demo(
    out: str | None = None,
    seed: int = 0,
    max_epochs: int | None = None,
    examples: int = 4,
    language: str = "en",
    data: dict | None = None,
    fit_extra: tuple[str, ...] = (),
    steps: int | None = None,
    minutes: float | None = None,
    threads: int | None = None,
) -> dict:
    """Run the demo in ``language`` (en, zh) into ``out``, training ``steps`` steps (default
    :data:`DEMO_STEPS`), or for ``minutes``, or ``max_epochs`` epochs, on ``threads``
    threads (default: the free cores); ``data`` replaces the data's sizes (:data:`DEMO_DATA`) and
    ``fit_extra`` adds fit options (the tests' tiny runs)."""
    if language not in DEMO_CONFIGS:
        raise ConfigError(f"--language: expected one of {', '.join(DEMO_CONFIGS)}, got {language!r}")
    out = out or DEMO_OUT[language]
    config = DEMO_CONFIGS[language]
    from captioning.api import Captioner
    from captioning.cli.evaluate import evaluate
    from captioning.data.shapes import generate
    from captioning.files import atomic_write_json
    from captioning.storage.load import load_model
    from captioning.training.cli import run_lightning_cli
    from captioning.viz.curves import plot_curves

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    print(f"[1/4] making the shapes dataset in {out_dir / 'data'}")
    annotations = out_dir / "data" / "dataset_shapes.json"
    generate(out_dir / "data", seed=seed, language=language, **(data or DEMO_DATA))

    length = (
        f"{minutes:g} minutes"
        if minutes is not None
        else f"{max_epochs} epochs"
        if max_epochs is not None
        else f"{steps or DEMO_STEPS:,} steps"
    )
    import torch

    n = threads or torch.get_num_threads()  # --threads N, or what the command chose (cli/options.py: apply_threads)
    print(f"[2/4] training soft attention on the CPU for {length}, {n} thread{'s' * (n > 1)} (configs/{config})")
    args = [
        "fit",
        "--config",
        str(config_path(config)),
        "--data.annotations",
        str(annotations),
        "--trainer.default_root_dir",
        str(out_dir / "train"),
        "--trainer.accelerator",
        "cpu",
        "--seed_everything",
        str(seed),
    ]
    args += budget_args(steps, minutes, max_epochs)
    if threads is not None:
        args += ["--threads", str(threads)]
    if language == "zh" and importlib.util.find_spec("jieba") is None:
        print("      jieba is not installed (pip install -e '.[zh]'): one token per Chinese character instead")
        args += ["--data.tokenizer", "chars"]
    args += list(fit_extra)
    t_fit = time.perf_counter()
    cli = run_lightning_cli(args)
    best = cli.trainer.checkpoint_callback.best_model_path or cli.trainer.checkpoint_callback.last_model_path
    train_seconds, trained = time.perf_counter() - t0, cli.trainer.global_step
    fit_seconds = time.perf_counter() - t_fit
    print(
        f"      trained {trained:,} steps in {fit_seconds / 60:.1f} min ({trained / max(fit_seconds, 1e-9):.2f} steps/s, "
        f"validations included)"
    )
    short = shortfall(trained, fit_seconds, minutes)
    if short:
        print(short)
    plot_curves(cli.trainer.log_dir, out_dir / "curves.png")  # loss and validation scores against the step

    print(f"[3/4] evaluating {best} on the test split (beam search, 3 beams)")
    model = load_model(best)
    report = evaluate(
        model,
        str(annotations),
        split="test",
        generation=model.spec.generation.replace(num_beams=3),
        metrics_path=str(out_dir / "metrics.json"),
        results_path=str(out_dir / "results.json"),
        checkpoint=best,
    )

    print("[4/4] captioning example images and writing attention GIFs")
    from captioning.data.formats.karpathy import load_karpathy

    test = [r for r in load_karpathy(str(annotations)) if r.split == "test"][:examples]
    captioner = Captioner.from_model(model, device="cpu", card={**model.card, "training_data": str(annotations)})
    paths = [str(out_dir / "data" / r.path) for r in test]
    results = captioner(paths, num_beams=3, return_attention=True)
    (out_dir / "attention").mkdir(exist_ok=True)
    captions = []
    for path, rec, res in zip(paths, test, results):
        stem = Path(path).stem
        gif = captioner.render(path, res, out_dir / "attention" / f"{stem}.gif", format="gif")
        png = captioner.render(path, res, out_dir / "attention" / f"{stem}.png", format="png")
        captions.append(
            {
                "image": path,
                "generated_text": res["generated_text"],
                "score": res["score"],
                "references": rec.captions,
                "gif": str(gif),
                "grid": str(png),
            }
        )
    atomic_write_json(out_dir / "captions.json", captions)

    total = time.perf_counter() - t0
    report["demo_seconds"] = {"train": round(train_seconds, 1), "total": round(total, 1)}
    report["demo_steps"] = trained
    atomic_write_json(out_dir / "metrics.json", report)
    s = report["scores"]

    def score(name):  # "n/a" for a metric that could not be computed (METEOR without Java)
        return f"{s[name]:.3f}" if isinstance(s.get(name), float) else "n/a"

    print()
    print(
        f"test split: BLEU-4 {score('BLEU-4')}  CIDEr {score('CIDEr')}  METEOR {score('METEOR')}  "
        f"object F1 {score('object_f1')}"
    )
    for key, note in report["notes"].items():
        if key.endswith("_error"):  # e.g. METEOR without Java
            print(f"note: {note}")
    for c in captions:
        print(f"  {c['image']}: {c['generated_text']}")
    from captioning.web.server import serve_command

    print(f"\nbest checkpoint: {best}")
    needs = (
        ""
        if importlib.util.find_spec("uvicorn")
        else f"  (needs the web extra first: {runnable('pip')} install -e '.[web]')"
    )
    # the commands as this environment runs them: its own scripts, when the shell would not find them
    serve = serve_command(best).replace("captioning ", f"{runnable()} ", 1)
    print(f"try it in a browser: {serve}{needs}")
    print(f"metrics:         {out_dir / 'metrics.json'}")
    print(f"curves:          {out_dir / 'curves.png'}  (and {runnable('tensorboard')} --logdir {cli.trainer.log_dir})")
    if short:
        print(short)
    print(f"captions:        {out_dir / 'captions.json'}")
    print(f"attention GIFs:  {out_dir / 'attention'}")
    if language != "en":
        from captioning.viz.fonts import INSTALL_HINT, cjk_font_path

        font = cjk_font_path()
        print(f"CJK font:        {font or 'none found, words drawn as boxes; ' + INSTALL_HINT}")
        tokens = report["notes"].get("tokens")
        if tokens:
            print(f"scored on:       {tokens} tokens (BLEU, ROUGE-L, CIDEr-D; docs/LANGUAGES.md)")
    print(f"done in {total / 60:.1f} min")
    return report


@COMMANDS.register("demo")
class Demo(Command):
    help = "make shapes data, train, evaluate, caption, write GIFs"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--out", default=None, help="the folder for everything the demo writes (outputs/demo, outputs/demo_zh)"
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the data and of training")
        length = p.add_mutually_exclusive_group()
        length.add_argument(
            "--steps",
            type=at_least(1),
            default=None,
            metavar="N",
            help=f"training steps (default: {DEMO_STEPS:,}, the README's scores on any machine; "
            "the time they take is printed early on)",
        )
        length.add_argument(
            "--minutes",
            type=at_least(0.1, float),
            default=None,
            metavar="M",
            help="a time budget instead: train for M minutes (the steps, and the scores, then depend on the machine)",
        )
        length.add_argument("--max-epochs", type=at_least(1), default=None, help="train N epochs instead")
        p.add_argument(
            "--language",
            choices=tuple(DEMO_CONFIGS),
            default="en",
            help="the captions' language: en, or zh (Chinese captions of the same images, "
            "configs/shapes_soft_zh.yaml; docs/LANGUAGES.md)",
        )

        threads_arg(p)

    def run(self, args: argparse.Namespace) -> int:
        run_demo(
            args.out,
            seed=args.seed,
            max_epochs=args.max_epochs,
            language=args.language,
            steps=args.steps,
            minutes=args.minutes,
            threads=args.threads,
        )
        return 0
