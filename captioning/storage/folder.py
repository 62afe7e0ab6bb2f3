"""Model folders in the Hugging Face layout: write one from a model, read one back, push it.

``captioning export --checkpoint CKPT --out DIR`` writes (layout.py describes the layout)
model.safetensors (the weights only: no optimizer state, no training loop), config.json, vocab.json
and a README.md model card. :func:`save_folder` writes a model and its
:class:`~captioning.models.spec.ModelSpec`; :func:`read_folder` reads them back into the
:class:`~captioning.storage.checkpoint.ModelFile` a checkpoint is also read into, from which
storage/load.py builds the model. Nothing is unpickled: safetensors holds a JSON header and raw
tensor bytes, and the rest is JSON.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from captioning import __version__
from captioning.common import grid_shape
from captioning.compat import UNRECORDED_INTERPOLATION
from captioning.errors import CaptioningError, CheckpointError
from captioning.files import atomic_write_bytes, atomic_write_json, atomic_write_text, folder_writer, remove_file
from captioning.models.spec import ModelSpec
from captioning.storage.checkpoint import TRAINING_KEYS, ModelFile, ModelSource, to_plain
from captioning.storage.layout import (
    CARD_FILE,
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    VOCAB_FILE,
    WEIGHTS_FILE,
    read_config,
    read_vocab,
)
from captioning.storage.paper_names import to_paper_names


def model_config(model, card: dict | None = None, spec: ModelSpec | None = None) -> dict:
    """config.json of a ShowAttendTell ``model`` (its ``spec``, unless given). ``card``: what the model
    card says; its "training" entry (the training settings) becomes config.json's "training"."""
    spec = (spec or model.spec).without_pretrained()  # the weights are in the folder
    plain, card = spec.to_dict(), dict(card or {})
    training = card.pop("training", None) or {}
    image_size = spec.image_size
    interpolation = spec.interpolation
    with torch.no_grad():  # the grid the encoder gives at this image size (one blank image)
        was_training = model.training
        model.eval()
        probe = next(model.parameters())
        features = model.encoder(torch.zeros(1, 3, image_size, image_size, dtype=probe.dtype, device=probe.device))
        model.train(was_training)
    L, D = int(features.size(1)), int(features.size(2))
    return to_plain(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "library": "captioning",
            "library_version": __version__,
            "architecture": "ShowAttendTell",
            "model": {
                "encoder": plain["encoder"],
                "decoder": plain["decoder"],
                "vocab_size": len(model.vocab),
                "num_locations": L,
                "feature_dim": D,
                "grid": list(grid_shape(L)),  # location l is cell (l // grid[1], l % grid[1])
            },
            "preprocessing": {
                "image_size": image_size,
                "interpolation": interpolation,  # PIL's filter of that name; absent in older folders: bilinear
                "resize": f"{interpolation} (antialiased when shrinking), the whole image stretched to a square, no crop",
                "scale": "pixel / 255",  # then (x - mean) / std per channel, inside the encoder
                "mean": model.encoder.mean.flatten().tolist(),
                "std": model.encoder.std.flatten().tolist(),
            },
            "generation": plain["generation"],
            "training": {k: training[k] for k in TRAINING_KEYS if k in training},
            "card": card,
        }
    )


def metrics_card(report: dict) -> dict:
    """The test scores of an ``evaluate`` report, for the model card."""
    scores = {}
    for key, value in (report.get("scores") or {}).items():  # numbers, and one level of groups (grounding.*)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scores[key] = value
        elif isinstance(value, dict):
            scores.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, float)})
    return to_plain(
        {
            "test_scores": scores,
            "test_split": {k: report.get(k) for k in ("annotations", "split", "num_images")},
            "test_generation": report.get("generation"),
        }
    )


#: the decoder settings a model card shows, as they are named there
DECODER_SIZES = {
    "hidden_dim": "width",
    "embed_dim": "embedding",
    "attention_dim": "attention",
    "layers": "layers",
    "heads": "heads",
}


def decoder_summary(decoder: dict) -> str:
    """ "lstm: width 512, embedding 512, attention 512, heads 1": a decoder's kind and sizes, from its settings."""
    sizes = ", ".join(f"{name} {decoder[key]}" for key, name in DECODER_SIZES.items() if key in decoder)
    return f"{decoder.get('kind', 'lstm')}: {sizes}"


def model_card(config: dict, title: str = "Show, Attend and Tell captioner") -> str:
    """README.md of a model folder: what the model is, its scores and how to load it."""
    m, p, card = config["model"], config["preprocessing"], config.get("card") or {}
    kind = m["decoder"].get("attention_kind", "soft")  # a transformer attends softly
    onnx = isinstance(config.get("onnx"), dict)
    lines = [
        "---",
        "library_name: captioning",
        "pipeline_tag: image-to-text",
        "tags:",
        "- image-captioning",
        "- show-attend-and-tell",
        f"- {kind}-attention",
        *(["- onnx"] if onnx else []),
        "---",
        "",
        f"# {title} ({kind} attention, {m['encoder']['name']} encoder)",
        "",
        "An image captioning model of the paper *Show, Attend and Tell: Neural Image Caption Generation with "
        "Visual Attention* (Xu et al., 2015), trained with the `captioning` package.",
        "",
        "| | |",
        "|---|---|",
        f"| attention | {kind} |",
        f"| encoder | {m['encoder']['name']}: {m['grid'][0]}x{m['grid'][1]} locations of {m['feature_dim']} features |",
        f"| decoder | {decoder_summary(m['decoder'])} |",
        f"| vocabulary | {m['vocab_size']} tokens |",
        f"| input | {p['image_size']}x{p['image_size']} RGB, {p.get('interpolation', 'bilinear')} resize of the whole image (no crop), "
        f"normalised with mean {[round(x, 4) for x in p['mean']]}, std {[round(x, 4) for x in p['std']]} |",
        f"| training data | {card.get('training_data') or 'not recorded'} |",
    ]
    if card.get("global_step") is not None:
        lines.append(f"| training steps | {card['global_step']} (epoch {card.get('epoch')}) |")
    if card.get("validation"):
        lines.append(f"| best validation score | {card['validation']['monitor']} = {card['validation']['best']:.4f} |")
    lines.append("")
    scores = card.get("test_scores")
    if scores:
        split = card.get("test_split") or {}
        gen = card.get("test_generation") or {}
        lines += [
            f"## Test scores ({split.get('split', 'test')} split of {split.get('annotations')}, "
            f"{split.get('num_images')} images, {gen.get('num_beams', '?')} beams"
            + (
                f", attention_temperature {gen['attention_temperature']:g}"
                if gen.get("attention_temperature", 1.0) != 1.0
                else ""
            )
            + ")",
            "",
            "| metric | score |",
            "|---|---|",
            *[f"| {k} | {v:.4f} |" for k, v in scores.items()],
            "",
        ]
    else:
        lines += [
            "Test scores: not recorded (export with `--metrics` and a report of `captioning evaluate --out`).",
            "",
        ]
    if onnx:
        lines += [
            "## Use (ONNX Runtime, no PyTorch)",
            "",
            "```bash",
            "captioning caption --onnx THIS_FOLDER photo.jpg",
            "```",
            "",
            "```python",
            "from captioning.export.onnx_captioner import OnnxCaptioner",
            'captioner = OnnxCaptioner("THIS_FOLDER")',
            'print(captioner("photo.jpg", num_beams=3)[0]["generated_text"])',
            "```",
            "",
        ]
    else:
        lines += [
            "## Use",
            "",
            "```python",
            "from captioning.api import Captioner",
            'captioner = Captioner.from_pretrained("THIS_FOLDER_OR_HUB_ID")',
            '[out] = captioner("photo.jpg", num_beams=3, return_attention=True)',
            'print(out["generated_text"])',
            "```",
            "",
            "```bash",
            "captioning caption --checkpoint THIS_FOLDER photo.jpg",
            "```",
            "",
        ]
    lines += [
        "Files: `config.json` (architecture, preprocessing, generation defaults), `vocab.json`, "
        + (
            "`encoder.onnx` and the decoder's time step `decoder_step*.onnx`."
            if onnx
            else "`model.safetensors` (weights only)."
        )
    ]
    return "\n".join(lines) + "\n"


def save_folder(out, model, card: dict | None = None, spec: ModelSpec | None = None) -> Path:
    """Write ``model`` (a ShowAttendTell with its ``spec``, unless given) as a model folder:
    model.safetensors, config.json, vocab.json, README.md. ``card``: what the model card says
    (:class:`~captioning.storage.checkpoint.ModelFile`'s card). Returns the folder."""
    from safetensors.torch import save

    out = Path(out)
    config = model_config(model, card, spec)
    weights = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    # a new folder is written in a temporary sibling and renamed into place; an existing one (export
    # --overwrite) loses its config.json first and gets it back last, every file written atomically
    # (a link in it is replaced, never written through): a folder stopped half-way is refused by the
    # readers (no config.json), never read as new weights under an old config
    with folder_writer(out, CheckpointError, "the model folder") as folder:
        remove_file(folder / CONFIG_FILE)
        atomic_write_bytes(folder / WEIGHTS_FILE, save(weights, metadata={"format": "pt", "library": "captioning"}))
        atomic_write_json(folder / VOCAB_FILE, model.vocab.to_dict())
        atomic_write_text(folder / CARD_FILE, model_card(config))
        atomic_write_json(folder / CONFIG_FILE, config)
    return out


def read_metrics(path: str | None) -> dict | None:
    """An ``evaluate`` report (its "scores"), for the model card; None without a path."""
    if path is None:
        return None
    from captioning.storage.layout import read_json

    report = read_json(path)
    if not isinstance(report, dict) or not isinstance(report.get("scores"), dict):
        raise CheckpointError(f'{path}: not a metrics report of `captioning evaluate --out` (no "scores")')
    return report


def read_folder(folder: str, source: ModelSource | None = None) -> ModelFile:
    """A model folder written by ``captioning export`` (config.json, vocab.json, model.safetensors),
    read (nothing is unpickled) and checked; every problem is one line naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = os.fspath(folder)
    config = read_config(folder, "safetensors")
    config_path = os.path.join(folder, CONFIG_FILE)
    try:
        spec = ModelSpec.from_dict(
            {
                "encoder": config["model"]["encoder"],
                "decoder": config["model"]["decoder"],
                "image_size": config["preprocessing"]["image_size"],
                "generation": config["generation"],
                "interpolation": config["preprocessing"].get("interpolation", UNRECORDED_INTERPOLATION),
            }
        )
    except CaptioningError as err:
        raise CheckpointError(f"{config_path}: hyperparameters do not fit this version of the model ({err})") from None
    vocab = read_vocab(folder, int(config["model"]["vocab_size"]))
    path = os.path.join(folder, WEIGHTS_FILE)
    try:
        weights = load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        detail = " ".join(str(err).split())[:150]
        raise CheckpointError(f"{path}: not a readable safetensors file, damaged or truncated ({detail})") from None
    card, training = config.get("card") or {}, config.get("training") or {}
    return ModelFile(
        spec=spec,
        vocab=vocab,
        weights=to_paper_names(weights, spec.decoder),
        card={**card, **({"training": training} if training else {})},
        source=source or ModelSource(folder, "folder", folder),
        files={"config": config_path, "weights": path},
    )


def push_to_hub(
    folder: str,
    repo_id: str,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload a Show, Attend and Tell captioner",
) -> str:
    """Upload a model folder to the Hugging Face Hub as model repository ``repo_id`` (created if
    needed; log in first with ``hf auth login`` or pass ``token``). Returns the repository's URL."""
    from huggingface_hub import HfApi

    read_config(folder, "onnx" if not os.path.isfile(os.path.join(folder, WEIGHTS_FILE)) else "safetensors")
    api = HfApi(token=token)
    url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message, repo_type="model")
    return str(url)


def folder_summary(folder: str) -> dict:
    """{file: bytes} of a model folder (for the export command's report)."""
    return {
        p.name: p.stat().st_size for p in sorted(Path(folder).iterdir()) if p.is_file() and not p.name.startswith(".")
    }


__all__ = ["save_folder", "read_folder", "push_to_hub", "model_config", "model_card", "metrics_card", "folder_summary"]
