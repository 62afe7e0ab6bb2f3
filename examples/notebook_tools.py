"""What the notebooks of examples/ (and examples/zh/) share: the shapes data they make, a short training
run through `captioning fit`, whether a mechanism is in this version of the package, and pictures shown
inline (attention GIFs and grids, and matrices: word by location, word by word).

Everything lands under outputs/notebooks/ of the repository. A run is kept there with the arguments
it was trained with, so running a notebook again (or another notebook that trains the same model)
loads it instead of training it again; delete the folder to start afresh.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "outputs" / "notebooks"

#: the notebooks' model: the demo's recipe (configs/shapes_soft.yaml), narrower, so that a run of a few
#: hundred steps takes a minute or two on a laptop's CPU
SMALL = {
    "model.encoder.dim": 128,
    "model.decoder.embed_dim": 64,
    "model.decoder.hidden_dim": 128,
    "model.decoder.attention_dim": 64,
    "data.batch_size": 48,
    "model.optimizer.ema_start_step": 10_000,  # no weight average in runs this short
}
#: what a Chinese run changes (configs/shapes_soft_zh.yaml): jieba's words, longer captions
CHINESE = {
    "data.tokenizer": "jieba" if importlib.util.find_spec("jieba") else "chars",
    "data.max_length": 50,
    "model.val_generation.max_new_tokens": 51,
    "model.test_generation.max_new_tokens": 51,
}
MESSAGES = {
    "en": {
        "skip": "skipped {name}: {why} (this version of the package does not have it yet)",
        "loaded": "{name}: loaded the run of {steps} steps in {path}",
        "trained": "{name}: trained {steps} steps in {seconds:.0f} s",
        "data": "the shapes data: {path}",
    },
    "zh": {
        "skip": "跳过 {name}：{why}（这一版本的代码包还没有这个机制）",
        "loaded": "{name}：载入已训练 {steps} 步的模型 {path}",
        "trained": "{name}：训练了 {steps} 步，用时 {seconds:.0f} 秒",
        "data": "形状数据集：{path}",
    },
}


def say(language: str, key: str, **values) -> None:
    print(MESSAGES[language][key].format(**values))


def make_data(
    language: str = "en", n_train: int = 1500, n_val: int = 50, n_test: int = 50, announce: bool = True
) -> Path:
    """The shapes data (captioning.data.shapes.generate: 64 px images, five captions each), made once."""
    from captioning.data.shapes import generate

    folder = OUT / f"data_{language}_{n_train}"
    annotations = folder / "dataset_shapes.json"
    if not annotations.is_file():
        generate(folder, n_train=n_train, n_val=n_val, n_test=n_test, seed=0, language=language, progress=False)
    if announce:
        say(language, "data", path=annotations.relative_to(REPO))
    return annotations


def test_images(annotations: Path, n: int = 4) -> list[str]:
    """The first ``n`` test images of the data, with their first reference caption printed."""
    from captioning.data.formats.karpathy import load_karpathy

    records = [r for r in load_karpathy(str(annotations)) if r.split == "test"][:n]
    for r in records:
        print(f"{Path(r.path).name}: {r.captions[0]}")
    return [str(annotations.parent / r.path) for r in records]


def missing(**options) -> str | None:
    """None when a decoder with these ``model.decoder`` options builds in this version of the package;
    otherwise the one line that says why not (a mechanism another version adds)."""
    from captioning.models.kinds import DECODERS, decoder_config

    sizes = {"embed_dim": 16, "hidden_dim": 16, "attention_dim": 8}
    try:
        if options.get("kind", "lstm") != "lstm":  # another decoder kind: its registered name (sizes of its own)
            DECODERS.check(options["kind"])
        else:
            decoder_config({**sizes, **options}).build(12, 16)
    except Exception as err:  # an unknown name (ConfigError) or a variant's file that is not there yet
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def train(
    name: str,
    steps: int = 300,
    language: str = "en",
    config: str = "shapes_soft.yaml",
    annotations: Path | None = None,
    seed: int = 0,
    small: bool = True,
    **options,
) -> Path | None:
    """Train ``steps`` steps of ``configs/<config>`` with the notebooks' small model and ``options``
    (``score="dot"`` for ``--model.decoder.score dot``; a key with a dot is a whole key, as
    ``**{"model.decoder.kind": "conv"}``) and return its last checkpoint, or print why the mechanism
    is skipped and return None. ``small``: the notebooks' narrower sizes (:data:`SMALL`), for the LSTM
    configs; False keeps the config's own. A run trained before with the same arguments is loaded instead."""
    from captioning.training.cli import run_lightning_cli

    decoder = {k: v for k, v in options.items() if "." not in k}
    why = missing(**decoder)
    if why is None and not (REPO / "configs" / config).is_file():
        why = f"configs/{config} not found"
    if why:
        say(language, "skip", name=name, why=why)
        return None
    annotations = annotations or make_data(language, announce=False)
    settings = {**(SMALL if small else {}), **(CHINESE if language == "zh" else {})}
    settings.update({k if "." in k else f"model.decoder.{k}": v for k, v in options.items()})
    args = ["--config", str(REPO / "configs" / config), "--data.annotations", str(annotations)]
    args += ["--trainer.max_time", "null", "--trainer.max_epochs", "1000", "--trainer.max_steps", str(steps)]
    args += ["--trainer.check_val_every_n_epoch", "1000", "--trainer.enable_progress_bar", "false"]
    args += ["--seed_everything", str(seed), "--trainer.accelerator", "cpu"]
    for key, value in settings.items():
        args += [f"--{key}", json.dumps(value) if not isinstance(value, str) else value]
    folder = OUT / "runs" / language / name
    stamp, checkpoint = folder / "arguments.json", folder / "last.ckpt"
    if checkpoint.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == args:
        say(language, "loaded", name=name, steps=steps, path=checkpoint.relative_to(REPO))
        return checkpoint
    start = time.perf_counter()
    with quiet(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = run_lightning_cli(["fit", *args, "--trainer.default_root_dir", str(folder / "train")])
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(cli.trainer.checkpoint_callback.last_model_path, checkpoint)
    stamp.write_text(json.dumps(args))
    say(language, "trained", name=name, steps=cli.trainer.global_step, seconds=time.perf_counter() - start)
    return checkpoint


@contextlib.contextmanager
def quiet():
    """Lightning's own lines (seed, accelerator, stopping) left out of the notebook while training."""
    loggers = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def picture_bytes(captioner, image, result, fmt: str = "gif", **kwargs) -> bytes:
    """``Captioner.render`` as bytes: it writes the picture to a path here (a release whose render
    returns the bytes itself is taken as it is)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"picture.{fmt}"
        out = captioner.render(image, result, path, format=fmt, **kwargs)
        return bytes(out) if isinstance(out, (bytes, bytearray)) else Path(out).read_bytes()


def gif(captioner, image, result, **kwargs):
    """The attention GIF (a frame per word), shown inline."""
    from IPython.display import Image

    return Image(data=picture_bytes(captioner, image, result, "gif", **kwargs), format="gif")


def grid(captioner, image, result, **kwargs):
    """The attention grid (a panel per word), shown inline."""
    from IPython.display import Image

    return Image(data=picture_bytes(captioner, image, result, "png", **kwargs), format="png")


def matrix(values, rows, columns=None, cell: int = 22, title: str = ""):
    """A matrix as a picture (inferno colours, each row scaled to its own maximum): rows labelled with
    ``rows`` (e.g. the words), columns with ``columns`` (words; None: numbered locations)."""
    from IPython.display import Image as Shown
    from PIL import Image, ImageDraw

    from captioning.viz.pictures import colorize, ui_font

    values = np.asarray(values, dtype=np.float64)
    scaled = values / np.maximum(values.max(axis=1, keepdims=True), 1e-12)
    columns = [str(j) for j in range(values.shape[1])] if columns is None else list(columns)
    font = ui_font(12, [*rows, *columns, title])
    left = 8 + max(int(font.getlength(r)) for r in rows)
    top = 20 + max(int(font.getlength(c)) for c in columns) if len(columns) <= 40 else 20
    picture = Image.new("RGB", (left + cell * values.shape[1] + 8, top + cell * values.shape[0] + 8), "white")
    picture.paste(
        Image.fromarray(colorize(scaled)).resize((cell * values.shape[1], cell * values.shape[0]), 0), (left, top)
    )
    draw = ImageDraw.Draw(picture)
    draw.text((4, 2), title, fill="black", font=font)
    for i, r in enumerate(rows):
        draw.text((left - 4 - font.getlength(r), top + i * cell + 4), r, fill="black", font=font)
    if len(columns) <= 40:  # column labels, written upwards
        for j, c in enumerate(columns):
            label = Image.new("RGBA", (int(font.getlength(c)) + 2, 14), (255, 255, 255, 0))
            ImageDraw.Draw(label).text((0, 0), c, fill="black", font=font)
            label = label.rotate(90, expand=True)
            picture.paste(label, (left + j * cell + 4, top - 4 - label.height), label)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return Shown(data=buffer.getvalue(), format="png")


def words(result) -> list[str]:
    """The caption's tokens without the end token: a row per word."""
    return [t for t in result["tokens"] if t != "<end>"]


def scores(captioner, annotations: Path, num_beams: int = 3) -> dict:
    """Object F1 and the pointing game of ``captioner`` on the data's test split (docs/EVALUATION.md):
    whether the caption names the right objects, and how often a shape word's map peaks in its box."""
    from captioning.data.formats.karpathy import load_karpathy
    from captioning.data.shapes import shapes_scores

    records = [r for r in load_karpathy(str(annotations)) if r.split == "test"]
    results = captioner([str(annotations.parent / r.path) for r in records], num_beams=num_beams, return_attention=True)
    predictions = {r.image_id: out["generated_text"] for r, out in zip(records, results)}
    alignments = {
        r.image_id: (out["tokens"], np.asarray(out["attention"]).reshape(len(out["tokens"]), -1), None)
        for r, out in zip(records, results)
    }
    found = shapes_scores(records, predictions, alignments, str(annotations.parent))
    pointing = found["grounding"].get("pointing_game")  # None: no shape word named an object of its image
    return {
        "object F1": round(found["object_f1"], 3),
        "pointing game": None if pointing is None else round(pointing, 3),
    }


def search_views(captioner, image, **generation) -> dict:
    """What greedy search kept beside alpha for one image (``GenerationOutput.views``: the gate "gate",
    a window's "window", ...), as arrays with a row per step; {} where this version keeps none."""
    import torch
    from PIL import Image

    batch = captioner._batch([Image.open(image).convert("RGB")])  # the model's input, as the Captioner makes it
    config = captioner.generation.replace(num_beams=1, **generation)
    with torch.no_grad():
        out = captioner.model.eval().generate(batch, config=config)
    return {k: v[0].cpu().numpy() for k, v in (getattr(out, "views", None) or {}).items()}


def plain_model(captioner):
    """The model as written (models/): the Captioner runs its fast twin (captioning/fast/) where there is one."""
    return getattr(captioner.model, "model", captioner.model).eval()


def _features(captioner, image):
    """The annotation vectors (1, L, D) of one image, as the Captioner feeds the model."""
    import torch
    from PIL import Image

    with torch.no_grad():
        return plain_model(captioner).encoder(captioner._batch([Image.open(image).convert("RGB")]))


def word_self_attention(captioner, image, result) -> list[np.ndarray]:
    """A Transformer decoder's masked self-attention over the caption ``result`` (the start token and
    its words), one (heads, T, T) array per layer, read by hooks on each layer's self-attention during a
    teacher-forced pass (models/transformer.py)."""
    import torch

    model, vocab = plain_model(captioner), captioner.vocab
    tokens = [t for t in result["tokens"] if t != vocab.EOS]
    captions = torch.tensor([vocab.encode(tokens)])
    weights, hooks = [], []
    for layer in model.decoder.layers:
        hooks.append(layer.self_attention.register_forward_hook(lambda m, i, out: weights.append(out[1][0])))
    try:
        with torch.no_grad():
            model(_features(captioner, image), captions, torch.tensor([captions.size(1)]))
    finally:
        for hook in hooks:
            hook.remove()
    n = len(tokens) + 1  # the start token and the words
    return [w[:, :n, :n].numpy() for w in weights]


def grid_self_attention(captioner, image) -> np.ndarray:
    """The first refiner layer's self-attention over the grid's cells, (heads, L, L): each cell's weights
    over every cell (models/attention/refiner.py: pre-norm, 2-D positions added first)."""
    import torch

    from captioning.common import grid_shape
    from captioning.models.attention.refiner import grid_position_embedding

    refiner = plain_model(captioner).decoder.refiner
    features = _features(captioner, image)
    gh, gw = grid_shape(features.size(1))
    x = features + grid_position_embedding(gh, gw, features.size(-1), features.device, features.dtype)
    first = refiner.layers.layers[0]
    with torch.no_grad():
        y = first.norm1(x)
        _, weights = first.self_attn(y, y, y, need_weights=True, average_attn_weights=False)
    return weights[0].numpy()
