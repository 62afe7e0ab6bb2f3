"""CLIPScore and RefCLIPScore (Hessel et al. 2021): how well a caption fits its image by CLIP, with
no references, and its harmonic mean with the caption's best match among the references.

    CLIP-S(c, v)      = w * max(cos(E_t("A photo depicts " + c), E_v(v)), 0),   w = 2.5
    RefCLIP-S(c, R, v) = H-mean(CLIP-S(c, v), max(max_r cos(E_t(c), E_t(r)), 0))   (the texts with that prefix too)

averaged over the images, as the paper's code does (its text prefix included). The CLIP model is an
OpenCLIP one (the extra ``ecosystem``): ``MODEL/TAG`` (e.g. ``ViT-B-32/openai``), its weights from
OpenCLIP's cache, or ``MODEL`` with ``weights=`` a local safetensors file or weights-only state dict
of the whole CLIP. Where none can be loaded (no open_clip, offline with nothing cached), the score
is reported unavailable with the reason, as METEOR is without Java.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from PIL import Image

from captioning.errors import CheckpointError, ConfigError

W = 2.5
PREFIX = "A photo depicts "


class ClipScorer:
    """An OpenCLIP model ready to score captions: ``scorer(images, captions, references)``."""

    def __init__(self, model, preprocess, tokenizer, name: str, device: str = "cpu"):
        self.model, self.preprocess, self.tokenizer = model.eval().to(device), preprocess, tokenizer
        self.name, self.device = name, device

    @classmethod
    def load(cls, spec: str, weights: Optional[str] = None, device: str = "cpu", pretrained: bool = True) -> "ClipScorer":
        """``spec`` = ``MODEL[/TAG]``; ``weights``: a local file instead of the tag's download;
        ``pretrained`` false: random weights (tests). One line of :class:`ConfigError` or
        :class:`CheckpointError` when the model cannot be had."""
        try:
            import open_clip
        except ImportError:
            raise ConfigError("CLIPScore needs open_clip: pip install 'captioning[ecosystem]'") from None
        model_name, _, tag = spec.partition("/")
        if model_name not in open_clip.list_models():
            raise ConfigError(f"--clip-model {spec}: no OpenCLIP model {model_name!r} "
                              "(python -c \"import open_clip; print(open_clip.list_models())\")")
        if pretrained and not tag and weights is None:
            raise ConfigError(f"--clip-model {spec}: name its weights (MODEL/TAG, e.g. ViT-B-32/openai) or pass --clip-weights FILE")
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=tag if pretrained and weights is None else None)
        except Exception as err:  # noqa: BLE001 -- offline and not cached, a bad tag, ...
            raise CheckpointError(f"--clip-model {spec}: its weights cannot be loaded ({' '.join(str(err).split())[:160]}); "
                                  "pass a local file with --clip-weights") from None
        if weights is not None:
            model.load_state_dict(_read_state(weights))
        return cls(model, preprocess, open_clip.get_tokenizer(model_name), spec, device)

    @torch.no_grad()
    def _text(self, texts: Sequence[str]) -> torch.Tensor:
        return F.normalize(self.model.encode_text(self.tokenizer(list(texts)).to(self.device)).float(), dim=-1)

    @torch.no_grad()
    def _images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        batch = torch.stack([self.preprocess(im) for im in images]).to(self.device)
        return F.normalize(self.model.encode_image(batch).float(), dim=-1)

    def __call__(self, images: Sequence[Image.Image], captions: Sequence[str],
                 references: Optional[Sequence[Sequence[str]]] = None, batch_size: int = 32) -> dict[str, float]:
        """{"CLIPScore", and with references "RefCLIPScore"}: means over the images."""
        clip_s, ref_s = [], []
        for start in range(0, len(captions), batch_size):
            end = min(start + batch_size, len(captions))
            v = self._images(images[start:end])  # (B, E)
            c = self._text([PREFIX + t for t in captions[start:end]])  # (B, E)
            s = W * (v * c).sum(-1).clamp(min=0)  # (B,)
            clip_s.append(s)
            if references is not None:  # (the paper's code gives references the prefix too)
                for i, refs in enumerate(references[start:end]):
                    r = self._text([PREFIX + t for t in refs])  # (R, E)
                    best = (r @ c[i]).max().clamp(min=0)
                    ref_s.append(2 * s[i] * best / (s[i] + best) if (s[i] + best) > 0 else s[i] * 0)
        scores = {"CLIPScore": float(torch.cat(clip_s).mean())}
        if references is not None:
            scores["RefCLIPScore"] = float(torch.stack(ref_s).mean())
        return scores


def _read_state(path: str) -> dict:
    """A CLIP state dict from a safetensors file or a weights-only torch file (never code)."""
    from captioning.files import safe_torch_load

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such CLIP weights file")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    state = safe_torch_load(path, legacy_pickle=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state
