"""Model folders in the Hugging Face layout: write one from a checkpoint, read one back, push it.

``captioning export --checkpoint CKPT --out DIR`` writes (model_files.py describes the layout)
model.safetensors (the weights only: no optimizer state, no training loop), config.json, vocab.json
and a README.md model card. :func:`read_folder` gives back what a checkpoint holds (plain
hyperparameters, vocabulary, weights), and :func:`read_checkpoint` reads a checkpoint file, a
folder or a Hub id into that dictionary, so that ``checkpoint.load_module`` -- the one loader of
every command -- takes any of them. Nothing is unpickled: safetensors holds
a JSON header and raw tensor bytes, and the rest is JSON.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch

from captioning import __version__
from captioning.viz.attention_maps import grid_shape
from captioning.errors import CheckpointError
from captioning.files import atomic_write_json, atomic_write_text, safe_torch_load
from captioning.storage.folder_json import (CARD_FILE, CONFIG_FILE, FORMAT, FORMAT_VERSION, VOCAB_FILE, WEIGHTS_FILE,
                                    read_config, read_vocab)

#: the hyperparameters that describe training rather than the model (kept in config.json's "training")
TRAINING_KEYS = ("objective", "optimizer", "val_generation", "nonfinite_loss", "init_from")


def _plain(value: Any) -> Any:
    """JSON types: tuples to lists, tensors to numbers, recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def model_config(model, hparams: dict, card: Optional[dict] = None) -> dict:
    """config.json of a ShowAttendTell ``model`` built from a checkpoint's ``hparams``."""
    image_size = int(hparams["image_size"])
    encoder = dict(hparams["encoder"], pretrained=False, weights=None)  # the weights are in the folder
    with torch.no_grad():  # the grid the encoder gives at this image size (one blank image)
        was_training = model.training
        model.eval()
        probe = next(model.parameters())
        features = model.encoder(torch.zeros(1, 3, image_size, image_size, dtype=probe.dtype, device=probe.device))
        model.train(was_training)
    L, D = int(features.size(1)), int(features.size(2))
    return _plain({
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "library": "captioning",
        "library_version": __version__,
        "architecture": "ShowAttendTell",
        "model": {
            "encoder": encoder,
            "decoder": hparams["decoder"],
            "vocab_size": len(model.vocab),
            "num_locations": L,
            "feature_dim": D,
            "grid": list(grid_shape(L)),  # location l is cell (l // grid[1], l % grid[1])
        },
        "preprocessing": {
            "image_size": image_size,
            "resize": "bilinear (antialiased when shrinking), the whole image stretched to a square, no crop",
            "scale": "pixel / 255",  # then (x - mean) / std per channel, inside the encoder
            "mean": model.encoder.mean.flatten().tolist(),
            "std": model.encoder.std.flatten().tolist(),
        },
        "generation": hparams["test_generation"],
        "training": {k: hparams[k] for k in TRAINING_KEYS if k in hparams},
        "card": card or {},
    })


def checkpoint_card(ckpt: dict) -> dict:
    """What a model card can say of a checkpoint: its training data, steps and best validation score
    (Lightning's ModelCheckpoint state)."""
    card: dict[str, Any] = {"training_data": ckpt.get("training_data"), "global_step": ckpt.get("global_step"),
                            "epoch": ckpt.get("epoch")}
    for key, state in (ckpt.get("callbacks") or {}).items():
        if str(key).startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("best_model_score") is not None:
            card["validation"] = {"monitor": state.get("monitor"), "best": _plain(state["best_model_score"])}
            break
    return _plain(card)


def metrics_card(report: dict) -> dict:
    """The test scores of an ``evaluate`` report, for the model card."""
    scores = {}
    for key, value in (report.get("scores") or {}).items():  # numbers, and one level of groups (grounding.*)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scores[key] = value
        elif isinstance(value, dict):
            scores.update({f"{key}.{k}": v for k, v in value.items() if isinstance(v, float)})
    return _plain({"test_scores": scores,
                   "test_split": {k: report.get(k) for k in ("annotations", "split", "num_images")},
                   "test_generation": report.get("generation")})


def model_card(config: dict, title: str = "Show, Attend and Tell captioner") -> str:
    """README.md of a model folder: what the model is, its scores and how to load it."""
    m, p, card = config["model"], config["preprocessing"], config.get("card") or {}
    kind = m["decoder"]["attention_kind"]
    onnx = isinstance(config.get("onnx"), dict)
    lines = [
        "---", "library_name: captioning", "pipeline_tag: image-to-text", "tags:", "- image-captioning",
        "- show-attend-and-tell", f"- {kind}-attention", *(["- onnx"] if onnx else []), "---", "",
        f"# {title} ({kind} attention, {m['encoder']['name']} encoder)", "",
        "An image captioning model of the paper *Show, Attend and Tell: Neural Image Caption Generation with "
        "Visual Attention* (Xu et al., 2015), trained with the `captioning` package.", "",
        "| | |", "|---|---|",
        f"| attention | {kind} |",
        f"| encoder | {m['encoder']['name']}: {m['grid'][0]}x{m['grid'][1]} locations of {m['feature_dim']} features |",
        f"| decoder | LSTM of {m['decoder']['hidden_dim']}, embedding {m['decoder']['embed_dim']}, attention {m['decoder']['attention_dim']} |",
        f"| vocabulary | {m['vocab_size']} tokens |",
        f"| input | {p['image_size']}x{p['image_size']} RGB, bilinear resize of the whole image (no crop), "
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
        lines += [f"## Test scores ({split.get('split', 'test')} split of {split.get('annotations')}, "
                  f"{split.get('num_images')} images, {gen.get('num_beams', '?')} beams"
                  + (f", attention_temperature {gen['attention_temperature']:g}" if gen.get("attention_temperature", 1.0) != 1.0
                     else "") + ")", "",
                  "| metric | score |", "|---|---|", *[f"| {k} | {v:.4f} |" for k, v in scores.items()], ""]
    else:
        lines += ["Test scores: not recorded (export with `--metrics` and a report of `captioning evaluate --out`).", ""]
    if onnx:
        lines += ["## Use (ONNX Runtime, no PyTorch)", "", "```bash", "captioning caption --onnx THIS_FOLDER photo.jpg", "```",
                  "", "```python", "from captioning.export.onnx_captioner import OnnxCaptioner",
                  'captioner = OnnxCaptioner("THIS_FOLDER")', 'print(captioner("photo.jpg", num_beams=3)[0]["generated_text"])',
                  "```", ""]
    else:
        lines += ["## Use", "", "```python", "from captioning.api import Captioner",
                  'captioner = Captioner.from_pretrained("THIS_FOLDER_OR_HUB_ID")',
                  '[out] = captioner("photo.jpg", num_beams=3, return_attention=True)', 'print(out["generated_text"])',
                  "```", "", "```bash", "captioning caption --checkpoint THIS_FOLDER photo.jpg", "```", ""]
    lines += ["Files: `config.json` (architecture, preprocessing, generation defaults), `vocab.json`, "
              + ("`encoder.onnx` and the decoder's time step `decoder_step*.onnx`." if onnx else
                 "`model.safetensors` (weights only).")]
    return "\n".join(lines) + "\n"


def save_folder(out, model, hparams: dict, card: Optional[dict] = None) -> Path:
    """Write ``model`` (a ShowAttendTell) as a model folder: model.safetensors, config.json,
    vocab.json, README.md. Returns the folder."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(model, hparams, card)
    weights = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    tmp = out / f".{WEIGHTS_FILE}.tmp"
    save_file(weights, str(tmp), metadata={"format": "pt", "library": "captioning"})
    os.replace(tmp, out / WEIGHTS_FILE)
    atomic_write_json(out / VOCAB_FILE, model.vocab.to_dict())
    atomic_write_json(out / CONFIG_FILE, config)
    atomic_write_text(out / CARD_FILE, model_card(config))
    return out


def read_metrics(path: Optional[str]) -> Optional[dict]:
    """An ``evaluate`` report (its "scores"), for the model card; None without a path."""
    if path is None:
        return None
    from captioning.storage.folder_json import read_json

    report = read_json(path)
    if not isinstance(report, dict) or not isinstance(report.get("scores"), dict):
        raise CheckpointError(f"{path}: not a metrics report of `captioning evaluate --out` (no \"scores\")")
    return report


def hparams_from_config(config: dict) -> dict:
    """The checkpoint-style hyperparameters of a config.json (training settings: as recorded, else defaults)."""
    training = config.get("training") or {}
    kind = config["model"]["decoder"].get("attention_kind", "soft")
    default_objective = "HardAttentionReinforce" if kind == "hard" else "CrossEntropy"
    return {
        "encoder": config["model"]["encoder"], "decoder": config["model"]["decoder"],
        "objective": training.get("objective") or {"class_path": default_objective, "init_args": {}},
        "optimizer": training.get("optimizer") or {}, "val_generation": training.get("val_generation") or {},
        "test_generation": config["generation"], "nonfinite_loss": training.get("nonfinite_loss", "error"),
        "image_size": config["preprocessing"]["image_size"],
    }


def read_folder(folder: str) -> dict:
    """A model folder as a checkpoint's dictionary: {"hyper_parameters", "vocabulary", "state_dict"
    (keys "model.*"), "training_data", "card"}, plus "_files" naming config.json and
    model.safetensors for the errors of whoever builds the model from it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = os.fspath(folder)
    config = read_config(folder, "safetensors")
    vocab = read_vocab(folder, int(config["model"]["vocab_size"]))
    path = os.path.join(folder, WEIGHTS_FILE)
    try:
        weights = load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        detail = " ".join(str(err).split())[:150]
        raise CheckpointError(f"{path}: not a readable safetensors file, damaged or truncated ({detail})") from None
    card = config.get("card") or {}
    return {
        "hyper_parameters": hparams_from_config(config),
        "vocabulary": vocab.to_dict(),
        "state_dict": {f"model.{k}": v for k, v in weights.items()},
        "training_data": card.get("training_data"),
        "card": card,
        "_files": {"config": os.path.join(folder, CONFIG_FILE), "weights": path},
    }


def read_checkpoint(path: str) -> dict:
    """A checkpoint file's dictionary, or a model folder's (a path, or a Hub id ``owner/name``) in the
    same form (model_folder.read_folder):
    {"state_dict", "hyper_parameters", "vocabulary", "training_data", ...}. Nothing that runs code is read."""
    from captioning.storage.folder_json import looks_like_hub_id, resolve_folder

    path = os.fspath(path)
    if looks_like_hub_id(path):  # owner/name: a model of the Hugging Face Hub (its cache when offline)
        path = resolve_folder(path)
    if os.path.isdir(path):
        return read_folder(path)
    ckpt = safe_torch_load(path, map_location="cpu")
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: not a captioning checkpoint (expected a dictionary)")
    for key in ("state_dict", "hyper_parameters", "vocabulary"):
        if key not in ckpt:
            raise CheckpointError(f"{path}: not a captioning checkpoint (no {key!r} inside)")
    return ckpt


def push_to_hub(folder: str, repo_id: str, private: Optional[bool] = None, token: Optional[str] = None,
                commit_message: str = "Upload a Show, Attend and Tell captioner") -> str:
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
    return {p.name: p.stat().st_size for p in sorted(Path(folder).iterdir()) if p.is_file() and not p.name.startswith(".")}


__all__ = ["save_folder", "read_folder", "read_checkpoint", "push_to_hub", "model_config", "model_card",
           "checkpoint_card", "metrics_card", "hparams_from_config", "folder_summary"]
