"""One model behind the page: a :class:`~captioning.api.Captioner` with its description, its
example images, a request's settings checked against it and its results turned into JSON."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.errors import ConfigError
from captioning.files import plain_json
from captioning.models import ATTENTION_MODES
from captioning.web.errors import RequestError
from captioning.web.examples import first_test_images, training_config
from captioning.web.gifs import DEFAULT_GIF_PIXELS, budgeted_gif
from captioning.web.settings import MAX_TOKENS, PAGE_BEAMS, Focus, Settings

MAX_LISTED_BEAMS = 5  # beams listed when the request does not say (diverse beam search lists all of them)


def model_inputs(captioner) -> tuple[tuple[int, str], ...]:
    """The (S, filter) of each resize ``captioner`` makes of an image (captioning/api.py:
    ``Captioner._batch``): one per member of an ensemble, at the member's size and with its filter;
    one for a model."""
    from captioning.data.images import DEFAULT_INTERPOLATION
    from captioning.decoding.ensemble import Ensemble

    model = getattr(captioner, "model", None)
    if isinstance(model, Ensemble):
        return tuple(
            (int(size), member.spec.interpolation or DEFAULT_INTERPOLATION)
            for size, member in zip(model.image_sizes, model.members)
        )
    return ((int(captioner.image_size), getattr(captioner, "interpolation", None) or DEFAULT_INTERPOLATION),)


def ensemble_members(path: str) -> list[str]:
    """``A+B+...`` -> the members of an ensemble served as one model; a path that exists as given
    (or has no ``+``) is one model."""
    if "+" not in path or Path(path).exists():
        return [path]
    return [part for part in path.split("+") if part]


class ServedModel:
    """One checkpoint behind the page: the captioner, its description and example images."""

    def __init__(self, name: str, captioner, checkpoint: Path | None = None, examples: Sequence[Path] = ()):
        self.name = name
        self.captioner = captioner
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.hard = getattr(captioner, "attention_kind", "soft") == "hard"
        config = training_config(self.checkpoint) if self.checkpoint is not None else None
        self.examples = list(examples) or first_test_images(config)
        self.description = self._describe(config)
        self.grid: tuple[int, int] | None = None  # the attention grid (gh, gw), known after the first caption
        self.inputs = model_inputs(captioner)  # the resizes the captioner makes of an upload (web/images.py: prepare)
        self.focus_problem = focus_problem(captioner)  # why a focus is refused (one line), None: it is not
        self.views = served_views(captioner)  # the views of captioning/viz/views.py this model offers

    @classmethod
    def load(
        cls, name: str | None, checkpoint, device: str = "cpu", examples: Sequence[Path] = (), layer=None
    ) -> ServedModel:
        """``layer`` (a number or "mean"; None: the model's own): the layer whose cross-attention maps a
        transformer's page and API show; a model without a transformer decoder is left as it is."""
        from captioning.api import Captioner
        from captioning.models.transformer import choose_attention_layer, transformer_members

        members = ensemble_members(str(checkpoint))
        if len(members) > 1:  # A+B: an ensemble, one model on the page (its training config: the first member's)
            captioner, first = Captioner.from_checkpoints(members, device=device), Path(members[0])
        else:
            captioner, first = Captioner.from_checkpoint(checkpoint, device=device), Path(checkpoint)
        if layer is not None and transformer_members(captioner.model):
            choose_attention_layer(captioner.model, layer)
        return cls(name or "", captioner, first, examples)

    def _describe(self, config: dict | None) -> dict:
        """attention, encoder, vocab_size, image_size, training_data, test_scores (+ checkpoint, parameters):
        ``Captioner.describe()``, the training data from the run's config.yaml when the checkpoint
        does not name it."""
        info: dict[str, Any] = dict(self.captioner.describe())
        if not info.get("training_data"):
            info["training_data"] = ((config or {}).get("data") or {}).get("annotations")
        info["training_data"] = _file_names(info.get("training_data"))
        if info.get("ensemble"):  # members by file name, as the training data: no server paths in the API
            info["ensemble"] = [{**m, "checkpoint": Path(m["checkpoint"]).name} for m in info["ensemble"]]
        info["parameters"] = int(sum(p.numel() for p in self.captioner.model.parameters()))
        if self.checkpoint is not None:
            info["checkpoint"] = self.checkpoint.name
        return plain_json(info, strict=True)

    def max_new_tokens(self, settings: Settings) -> int:
        """The request's maximum length, or the model's own, never over :data:`MAX_TOKENS`."""
        own = getattr(self.captioner.generation, "max_new_tokens", None) or MAX_TOKENS
        return min(settings.max_new_tokens or int(own), MAX_TOKENS)

    def defaults(self) -> dict:
        g = self.captioner.generation
        return plain_json(
            {
                "num_beams": PAGE_BEAMS,
                "max_new_tokens": self.max_new_tokens(Settings()),
                "length_penalty": g.length_penalty,
                "attention_mode": g.attention_mode if self.hard else None,
            },
            strict=True,
        )

    def info(self) -> dict:
        """What GET /api/models tells about this model."""
        return {
            "name": self.name,
            "description": self.description,
            "defaults": self.defaults(),
            "grid": list(self.grid) if self.grid else None,
            "returns_beams": True,
            "attention_modes": list(ATTENTION_MODES) if self.hard else [],
            "views": self.views,
            "mechanism": self.mechanism(),
        }

    def mechanism(self) -> dict | None:
        """The model's attention mechanism and its equations (viz/atlas.py's catalogue), None when unknown."""
        from captioning.viz.atlas import mechanism_of

        decoder = getattr(getattr(self.captioner, "spec", None), "decoder", None)
        if decoder is None:
            return None
        name, equations = mechanism_of(decoder)
        return {"name": name, "equations": equations}

    # ------------------------------------------------------------------ settings
    def settings(self, fields: Mapping[str, str]) -> Settings:
        """A request's form fields as :class:`Settings`, each checked alone and then all together over
        the model's own generation settings (the config the captioner will build), so that a
        combination the model refuses is the client's 400, not the worker's failure."""
        settings = Settings.parse(fields, self.hard)
        try:
            config = self.captioner.generation.replace(**self.generation_kwargs(settings))
            config.resolve_tokens(self.captioner.vocab)  # suppress_tokens may name words the model lacks
        except ConfigError as err:
            raise RequestError(str(err)) from None
        return settings

    def generation_kwargs(self, settings: Settings) -> dict[str, Any]:
        """The captioner's decoding keywords of ``settings``: the fields the request set, the
        length capped, and the beams to list (every beam of diverse beam search, so that each
        group's captions show side by side; else the top :data:`MAX_LISTED_BEAMS`)."""
        kwargs = {name: value for name, value in settings.as_dict().items() if value is not None}
        kwargs["max_new_tokens"] = self.max_new_tokens(settings)
        if settings.num_beam_groups == 1:
            del kwargs["num_beam_groups"]
        every = settings.num_beams if settings.num_beam_groups > 1 else min(settings.num_beams, MAX_LISTED_BEAMS)
        kwargs["num_return_sequences"] = settings.num_return_sequences or every
        return kwargs

    # ------------------------------------------------------------------ work
    def caption(
        self,
        images: list[Image.Image],
        settings: Settings,
        focus: Sequence[tuple[Focus, tuple[int, int]] | None] | None = None,
        views: bool = False,
    ) -> list[dict]:
        """Raw results of the captioner (numpy attention), one per image, with "beams" always present
        (with ``views``, their "views": ``Captioner(..., return_views=True)``'s).

        ``focus``: per image, None or (its :class:`Focus`, the uploaded image's (W, H)): the box,
        in the upload's pixels, is carried to the model input's (``images``, resized without a
        crop from the upload: web/images.py), so the prior is the one ``captioning caption
        --focus`` puts on the upload itself. The focused images share one strength."""
        kwargs = self.generation_kwargs(settings)
        if focus and any(f is not None for f in focus):
            from captioning.decoding.steering import scale_box

            kwargs["focus"] = [
                None if f is None else scale_box(f[0].box, f[1], image.size) for f, image in zip(focus, images)
            ]
            kwargs["focus_strength"] = next(f[0].strength for f in focus if f is not None)
        if views and self.views:
            kwargs["return_views"] = True
        results = self.captioner(images, return_attention=True, **kwargs)
        for result in results:
            if not result.get("beams"):  # no list of beams: the best one alone
                result["beams"] = [{"generated_text": result["generated_text"], "score": result["score"]}]
            if self.grid is None and result.get("attention") is not None:
                self.grid = tuple(int(n) for n in np.shape(result["attention"])[1:])
        return results

    def gif(self, image: Image.Image, result: dict, max_pixels: int = DEFAULT_GIF_PIXELS) -> tuple[bytes | None, dict]:
        """The attention GIF of one result (a frame per word, then the whole caption) within
        ``max_pixels``, and its description (:func:`~captioning.web.gifs.budgeted_gif`)."""
        words, maps, cells = list(result["tokens"]), result["attention"], list(result["locations"])
        if words and words[-1] == self.captioner.vocab.EOS:  # a frame per word: the end token gets none
            words, maps, cells = words[:-1], maps[:-1], cells[:-1]
        return budgeted_gif(image, words, maps, cells if self.hard else None, max_pixels)

    def to_json(self, result: dict) -> dict:
        """A result in the API's JSON: text, score, tokens, per-token maps (4 decimals), cells, beams."""
        attention = np.asarray(result["attention"], dtype=np.float64)
        return {
            "model": self.name,
            "generated_text": result["generated_text"],
            "score": plain_json(float(result["score"]), strict=True),
            "tokens": list(result["tokens"]),
            "attention": np.round(attention, 4).tolist(),
            "attention_shape": list(attention.shape),
            "locations": [[int(r), int(c)] for r, c in result["locations"]],
            "attention_kind": "hard" if self.hard else "soft",
            "beams": [
                {"generated_text": b["generated_text"], "score": plain_json(float(b["score"]), strict=True)}
                for b in result["beams"]
            ],
            **({"views": views_json(result["views"])} if "views" in result else {}),
        }


def views_json(views: dict) -> dict:
    """A result's views (captioning/api.py: VIEW_SHAPES) as JSON: each array as nested lists (weights
    rounded to 4 decimals) with its shape."""
    out = {}
    for name, value in views.items():
        array = np.asarray(value)
        values = array.tolist() if array.dtype.kind in "iub" else np.round(array.astype(np.float64), 4).tolist()
        out[name] = {"shape": list(array.shape), "values": values}
    return out


def served_views(captioner) -> list[str]:
    """The views (viz/views.py: VIEWS) a served captioner draws: none beyond its maps for one
    without views (an ONNX folder's)."""
    from captioning.viz.views import offered

    if not hasattr(captioner, "views"):
        return ["maps"]
    return offered(captioner.views())


def focus_problem(captioner) -> str | None:
    """Why ``captioner`` cannot take a focus, in one line (decoding/steering.py: steer_problem), or None."""
    from captioning.decoding.steering import steer_problem

    decoder = getattr(getattr(captioner, "model", None), "decoder", None)
    if decoder is None:
        return "focus: this model has no attention scores to steer"
    return steer_problem(decoder)


def _file_names(value):
    """A training-data path (or list of them) reduced to file names: a server's folders are not shown."""
    if isinstance(value, (list, tuple)):
        return [_file_names(v) for v in value]
    if isinstance(value, (str, os.PathLike)):
        return Path(value).name or str(value)
    return value
