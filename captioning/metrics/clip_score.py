"""CLIPScore and RefCLIPScore (Hessel et al. 2021): how well a caption fits its image by CLIP, with
no references, and its harmonic mean with the caption's best match among the references.

    CLIP-S(c, v)      = w * max(cos(E_t("A photo depicts " + c), E_v(v)), 0),   w = 2.5
    RefCLIP-S(c, R, v) = H-mean(CLIP-S(c, v), max(max_r cos(E_t(c), E_t(r)), 0))   (the texts with that prefix too)

averaged over the images, as the paper's code does (its text prefix included). The CLIP model is an
OpenCLIP one (the extra ``ecosystem``). It is ``MODEL/TAG`` (e.g. ``ViT-B-32/openai``; the tag one of
OpenCLIP's for the model, :func:`check_open_clip_name`), its weights from OpenCLIP's cache; or
``MODEL`` with ``weights=`` a local safetensors file or weights-only state dict of the whole CLIP;
or ``hf-hub:owner/name`` (``local-dir:PATH``) for one published on the Hub (SigLIP, DFN, fine-tuned
ones): its open_clip_config.json and safetensors weights (:func:`load_hosted_open_clip`).
Where none can be loaded (no open_clip, offline with nothing cached, a damaged weights file), the
score is reported unavailable with the reason, as METEOR is without Java. :class:`ClipScoring` is what the
Evaluator calls (``evaluate``, ``captioning test`` and, when asked, validation: :class:`ClipScoreConfig`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image

from captioning.errors import CheckpointError, ConfigError
from captioning.files import read_state_dict
from captioning.hub_weights import check_hosted_name, hosted_file, hosted_weights, is_hosted

W = 2.5
PREFIX = "A photo depicts "
#: why the scores are missing when no CLIP model was named
NOT_COMPUTED = "not computed (pass --clip-model MODEL/TAG, e.g. ViT-B-32/openai, or --clip-weights FILE)"

log = logging.getLogger(__name__)


@dataclass
class ClipScoreConfig:
    """CLIPScore and RefCLIPScore in ``captioning test`` (``--model.clip_score.model ViT-B-32/openai``)
    and, with ``validation`` true, in every validation (slow: CLIP encodes the split's images and
    captions each time).

    Args:
        model: the OpenCLIP ``MODEL/TAG`` (weights from OpenCLIP's cache), or ``MODEL`` with ``weights``.
        weights: a local safetensors file or weights-only state dict of the whole CLIP.
        validation: also score validation's captions (logged as ``val/CLIPScore``, ``val/RefCLIPScore``).
    """

    model: str | None = None
    weights: str | None = None
    validation: bool = False


class ClipScoring:
    """CLIPScore and RefCLIPScore of a split's captions with a CLIP model named once and loaded at the
    first call (on ``device``; default: CUDA when present), or why they are missing.

    ``scoring(images, predictions, references)`` -> (scores, notes): ``images(ids)`` gives the PIL
    images of those image ids; notes hold "CLIPScore" (a line) when the scores are missing. A model
    that cannot be loaded is tried once; its reason is logged once and noted every time.
    """

    def __init__(self, model: str | None = None, weights: str | None = None, device: str | None = None):
        self.model, self.weights, self.device = model, weights, device
        self._scorer: ClipScorer | None = None
        self._missing: str | None = NOT_COMPUTED if model is None else None

    @classmethod
    def of(cls, config: ClipScoreConfig | None, device: str | None = None) -> ClipScoring | None:
        """The scoring a :class:`ClipScoreConfig` asks for; None when it names no model."""
        if config is None or config.model is None:
            return None
        return cls(config.model, config.weights, device)

    def scorer(self) -> ClipScorer | None:
        """The loaded CLIP model (loaded now if needed), or None with the reason in :attr:`missing`."""
        if self._scorer is None and self._missing is None:
            from captioning.common import default_device
            from captioning.errors import CaptioningError

            try:
                self._scorer = ClipScorer.load(self.model, self.weights, str(default_device(self.device)))
            except CaptioningError as err:
                self._missing = f"unavailable: {err}"
                log.warning("CLIPScore %s", self._missing)
        return self._scorer

    @property
    def missing(self) -> str | None:
        return self._missing

    def __call__(
        self, images: Callable[[list], Sequence[Image.Image]], predictions: dict, references: dict
    ) -> tuple[dict[str, float], dict[str, str]]:
        scorer = self.scorer()
        if scorer is None:
            return {}, {"CLIPScore": self._missing}
        ids = list(predictions)
        return scorer(images(ids), [predictions[i] for i in ids], [references[i] for i in ids]), {}


class ClipScorer:
    """An OpenCLIP model ready to score captions: ``scorer(images, captions, references)``."""

    def __init__(self, model, preprocess, tokenizer, name: str, device: str = "cpu"):
        self.model, self.preprocess, self.tokenizer = model.eval().to(device), preprocess, tokenizer
        self.name, self.device = name, device

    @classmethod
    def load(cls, spec: str, weights: str | None = None, device: str = "cpu", pretrained: bool = True) -> ClipScorer:
        """``spec`` = ``MODEL[/TAG]`` or ``hf-hub:owner/name``; ``weights``: a local file instead of the
        tag's download; ``pretrained`` false: random weights (tests). One line of :class:`ConfigError`
        or :class:`CheckpointError` when the model cannot be had."""
        try:
            import open_clip
        except ImportError:
            raise ConfigError("CLIPScore needs open_clip: pip install -e '.[ecosystem]'") from None
        if is_hosted(spec):
            label = f"--clip-model {spec}"
            model, preprocess_cfg = load_hosted_open_clip(
                label, spec, pretrained and weights is None, instead="--clip-weights FILE (a safetensors file)"
            )
            if weights is not None:
                _load_state(model, read_state_dict(weights, "CLIP weights"), weights, spec)
            size = model.visual.image_size
            preprocess = open_clip.image_transform(
                size if isinstance(size, int) else tuple(size),
                is_train=False,
                mean=preprocess_cfg.get("mean"),
                std=preprocess_cfg.get("std"),
                interpolation=preprocess_cfg.get("interpolation"),
            )
            return cls(model, preprocess, open_clip.get_tokenizer(spec), spec, device)
        model_name, _, tag = spec.partition("/")
        check_open_clip_name(f"--clip-model {spec}", model_name, tag)
        if pretrained and not tag and weights is None:
            raise ConfigError(
                f"--clip-model {spec}: name its weights (MODEL/TAG, e.g. ViT-B-32/openai) or pass --clip-weights FILE"
            )
        state = (
            read_state_dict(weights, "CLIP weights") if weights is not None else None
        )  # before building: a bad file fails fast
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                model_name, pretrained=tag if pretrained and weights is None else None
            )
        except Exception as err:  # noqa: BLE001 -- offline and not cached, ...
            raise CheckpointError(
                f"--clip-model {spec}: its weights cannot be loaded ({' '.join(str(err).split())[:160]}); "
                "pass a local file with --clip-weights"
            ) from None
        if state is not None:
            _load_state(model, state, weights, model_name)
        return cls(model, preprocess, open_clip.get_tokenizer(model_name), spec, device)

    @torch.no_grad()
    def _text(self, texts: Sequence[str]) -> torch.Tensor:
        return F.normalize(self.model.encode_text(self.tokenizer(list(texts)).to(self.device)).float(), dim=-1)

    @torch.no_grad()
    def _images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        batch = torch.stack([self.preprocess(im) for im in images]).to(self.device)
        return F.normalize(self.model.encode_image(batch).float(), dim=-1)

    def __call__(
        self,
        images: Sequence[Image.Image],
        captions: Sequence[str],
        references: Sequence[Sequence[str]] | None = None,
        batch_size: int = 32,
    ) -> dict[str, float]:
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


def check_open_clip_name(field: str, model: str, tag: str = "") -> None:
    """A one-line ConfigError, starting with ``field``, unless OpenCLIP has the model ``model`` and,
    when ``tag`` is given, that pretrained tag for it. A tag outside OpenCLIP's list (a path, as in
    ``ViT-B-32//path/x.pt``) would reach OpenCLIP's own loader, which reads files with its own
    settings rather than the project's weights-only loader (:func:`captioning.files.safe_torch_load`)."""
    try:
        import open_clip
    except ImportError:
        raise ConfigError(f"{field}: needs open_clip: pip install -e '.[ecosystem]'") from None
    if model not in open_clip.list_models():
        raise ConfigError(
            f"{field}: OpenCLIP has no model {model!r}; list the names with "
            f'python -c "import open_clip; print(open_clip.list_models())"'
        )
    if tag and tag not in open_clip.list_pretrained_tags_by_model(model):
        raise ConfigError(
            f"{field}: OpenCLIP has no pretrained tag {tag[:80]!r} for {model}; list them with "
            f"python -c \"import open_clip; print(open_clip.list_pretrained_tags_by_model('{model}'))\""
        )


def hosted_open_clip_config(label: str, model: str) -> tuple[dict, dict]:
    """(model configuration, preprocessing configuration) of an OpenCLIP model on the Hub or in a folder
    (``hf-hub:owner/name`` / ``local-dir:PATH``), from its open_clip_config.json; one line if unreadable."""
    import json

    check_hosted_name(label, model)
    path = hosted_file(label, model, "open_clip_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        model_cfg, preprocess = dict(config["model_cfg"]), dict(config.get("preprocess_cfg") or {})
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{label}: {path}: not an OpenCLIP config ({type(err).__name__}: {err})") from None
    return model_cfg, preprocess


def load_hosted_open_clip(label: str, model: str, pretrained: bool, instead: str) -> tuple[torch.nn.Module, dict]:
    """(the CLIP model, its preprocessing configuration) of an OpenCLIP model on the Hub or in a folder:
    built from its open_clip_config.json by OpenCLIP's classes, with its safetensors weights when
    ``pretrained`` (a pickle is refused before it is read: captioning/hub_weights.py)."""
    import open_clip

    model_cfg, preprocess = hosted_open_clip_config(label, model)
    custom = bool(model_cfg.pop("custom_text", False)) or "hf_model_name" in (model_cfg.get("text_cfg") or {})
    try:
        clip = (open_clip.CustomTextCLIP if custom else open_clip.CLIP)(**model_cfg)
    except Exception as err:  # noqa: BLE001 -- a configuration this OpenCLIP cannot build (a newer field...)
        raise ConfigError(
            f"{label}: OpenCLIP could not build its model_cfg ({type(err).__name__}: {' '.join(str(err).split())[:150]})"
        ) from None
    if pretrained:
        path = hosted_weights(label, model, "open_clip_model.safetensors", instead=instead)
        _load_state(clip, read_state_dict(path, "CLIP weights"), path, model)
    # what OpenCLIP's own loader sets on the tower: the normalisation (OpenAI's unless the config says)
    clip.visual.image_mean = tuple(preprocess.get("mean") or open_clip.OPENAI_DATASET_MEAN)
    clip.visual.image_std = tuple(preprocess.get("std") or open_clip.OPENAI_DATASET_STD)
    return clip, preprocess


def _load_state(model: torch.nn.Module, state: dict, path: str, model_name: str) -> None:
    """Load ``state`` (read from ``path``) into ``model``; a one-line CheckpointError naming the file
    when its tensors are not those of OpenCLIP's ``model_name`` (missing, unexpected, other shapes)."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # tensors of other shapes; the message lists each on its own line
        lines = [line.strip() for line in str(err).splitlines() if line.strip().startswith("size mismatch")]
        raise CheckpointError(
            f"{path}: not the weights of OpenCLIP's {model_name} ({(lines or [' '.join(str(err).split())])[0][:160]})"
        ) from None
    if missing or unexpected:
        example = f"e.g. {missing[0]!r}" if missing else f"e.g. {unexpected[0]!r} unexpected"
        raise CheckpointError(
            f"{path}: not the weights of OpenCLIP's {model_name} ({len(missing)} tensors missing, "
            f"{len(unexpected)} unexpected, {example})"
        )
