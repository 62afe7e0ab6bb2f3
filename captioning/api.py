"""The Python API: load a checkpoint or model folder, caption images, get attention maps, render them.

    from captioning.api import Captioner
    captioner = Captioner.from_checkpoint("best.ckpt")   # or .from_pretrained("model_folder" or "owner/name")
    [out] = captioner("photo.jpg", num_beams=3, return_attention=True)
    out["generated_text"], out["score"], out["attention"].shape   # (T, gh, gw)
    captioner.render("photo.jpg", out, "photo.gif")
    ensemble = Captioner.from_checkpoints(["a.ckpt", "b.ckpt"], weights=[0.7, 0.3])   # decoding/ensemble.py

Generation arguments are the fields of :class:`~captioning.decoding.generation.GenerationConfig`,
with the names of Hugging Face's ``generate`` (num_beams, max_new_tokens, do_sample, top_p, ...):
``help(Captioner.__call__)`` lists them with their bounds.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from captioning.common import default_device, grid_shape
from captioning.data.images import DEFAULT_INTERPOLATION, as_rgb, pixels_to_float, to_tensor
from captioning.decoding.ensemble import Ensemble
from captioning.decoding.generation import GenerationConfig, generation_options, when_options_change
from captioning.decoding.steering import focus_biases, focus_boxes, generate_focused
from captioning.errors import ConfigError
from captioning.fast import fast_model
from captioning.models.show_attend_tell import ShowAttendTell
from captioning.models.spec import ModelSpec
from captioning.models.transformer import attention_layer_field
from captioning.plugins import load_plugins

ImageInput = str | os.PathLike | Image.Image | np.ndarray | torch.Tensor

#: the arrays of a result's "views" (``return_views=True``), T the caption's tokens (EOS included), L
#: the grid's locations (row-major), each present when the model has it (:meth:`Captioner.views`); any
#: other view a decoder's steps give (hierarchical attention's regions, ...) comes as (T, ...) under its name
VIEW_SHAPES = {
    "alignment": "(T, L): the word-by-location matrix, row t the weights word t read the locations with",
    "gate": "(T,): beta_t, the gate on the context (the LSTM decoder's)",
    "window": "(T, 3): a local window's centre row, centre column and extent, in grid cells",
    "self": "(T, layers, heads, T): a Transformer's self-attention, row t the step writing token t, "
    "column s the token read at position s (<start>, then the caption's tokens)",
    "refiner": "(layers, heads, L, L): a grid refiner's self-attention, row i location i's weights",
    "sample": "(T, 2): the (row, column) cell hard attention sampled for each token (attention_mode "
    "sample; a multi-head model's: (T, heads, 2)); its soft map is the alignment's row",
    "layers": "(T, layers, L): a convolutional decoder's maps, one per layer",
}


def as_pil(image: ImageInput) -> Image.Image:
    """Any accepted input -> RGB PIL image (:func:`captioning.data.images.as_rgb`)."""
    return as_rgb(image)


class Captioner:
    """A trained captioner with its preprocessing, ready to caption images.

    ``generation``: the default settings of :meth:`__call__` (Hugging Face's default of one beam,
    the model's caption length); each call may override any of them by name.

    ``model`` may be an :class:`~captioning.decoding.ensemble.Ensemble` (:meth:`from_checkpoints`):
    each member then reads the images at its own size, and the attention maps are the members'
    mean map.
    """

    def __init__(
        self,
        model: ShowAttendTell | Ensemble,
        image_size: int | None = None,
        generation: GenerationConfig | None = None,
        description: dict | None = None,
        device: str | torch.device | None = None,
        spec: ModelSpec | None = None,
    ):
        self.device = default_device(device)
        self.model = fast_model(model.eval().to(self.device))  # its fast twin where it has one (captioning/fast/)
        self.spec = spec or getattr(model, "spec", None)  # the model's description, for save_pretrained
        if image_size is None and self.spec is None:
            raise ValueError("Captioner needs the image size of a model without a spec (image_size=...)")
        self.vocab = model.vocab
        self.image_size = int(image_size if image_size is not None else self.spec.image_size)
        #: the resize's filter (data/images.py: INTERPOLATIONS), the model's
        self.interpolation = getattr(self.spec, "interpolation", None) or DEFAULT_INTERPOLATION
        self.attention_kind = model.attention_kind
        self.generation = generation or GenerationConfig()
        self.description = dict(description or {})
        self._locations: int | tuple[int, ...] | None = None  # L, read on first use (grid_locations)
        self._views: tuple[str, ...] | None = None  # the views of return_views, read on first use (views)

    @classmethod
    def from_model(
        cls,
        model: ShowAttendTell,
        device: str | torch.device | None = None,
        spec: ModelSpec | None = None,
        card: dict | None = None,
    ) -> Captioner:
        """The captioner of a model and its spec (``model.spec`` unless given) and card (``model.card``):
        a model :func:`~captioning.storage.load.load_model` gives. The default decoding is the spec's
        with one beam (Hugging Face's default)."""
        spec = spec or model.spec
        card = dict(card if card is not None else getattr(model, "card", None) or {})
        generation = spec.generation.one_beam()
        description = {
            "encoder": spec.encoder.name,
            "training_data": card.get("training_data"),
            "test_scores": card.get("test_scores"),
            "card": card,
        }
        return cls(model, spec.image_size, generation, description, device, spec=spec)

    @classmethod
    def from_module(
        cls, module, device: str | torch.device | None = None, training_data: str | None = None
    ) -> Captioner:
        """The captioner of a trained CaptioningModule (e.g. the one a fit returned): its model."""
        spec = getattr(module.model, "spec", None) or ModelSpec(
            module.encoder_config, module.decoder_config, module.image_size, module.test_generation
        )
        card = dict(getattr(module, "card", None) or {})
        if training_data:
            card["training_data"] = training_data
        return cls.from_model(module.model, device, spec, card)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, device: str | torch.device | None = None) -> Captioner:
        """The captioner of a checkpoint file (``captioning fit``'s) or of a model folder (``captioning export``'s)."""
        from captioning.storage.load import load_model

        return cls.from_model(load_model(path), device)

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[str | os.PathLike],
        weights: Sequence[float] | None = None,
        device: str | torch.device | None = None,
    ) -> Captioner:
        """The captioner of an ensemble of checkpoints or model folders of one vocabulary
        (:class:`~captioning.decoding.ensemble.Ensemble`): their log-probabilities averaged at each
        step, weighted by ``weights`` (normalised to sum 1; equal by default). One path gives that
        model's captioner. The default decoding is the first model's spec's, with one beam."""
        from captioning.storage.load import load_model

        paths = [os.fspath(p) for p in paths]
        if len(paths) == 1 and weights is None:
            return cls.from_checkpoint(paths[0], device)
        ensemble = Ensemble([load_model(p) for p in paths], weights, names=paths)
        description = {
            "encoder": " + ".join(m.spec.encoder.name for m in ensemble.members),
            "ensemble": [{"checkpoint": p, "weight": w} for p, w in zip(paths, ensemble.weights)],
        }
        return cls(
            ensemble,
            ensemble.spec.image_size,
            ensemble.spec.generation.one_beam(),
            description,
            device,
            spec=ensemble.spec,
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike,
        device: str | torch.device | None = None,
        revision: str | None = None,
        local_files_only: bool | None = None,
        cache_dir: str | None = None,
        token: str | bool | None = None,
    ) -> Captioner:
        """The captioner of a model folder (``captioning export``'s) or of a Hugging Face Hub model ``owner/name``.

        Only JSON and safetensors are read: nothing is unpickled. A Hub id is fetched into (or found
        in) huggingface_hub's cache; ``local_files_only`` (default: true when ``HF_HUB_OFFLINE`` is
        set) uses the cache only, and a model not there is a one-line error. ``token``: as
        huggingface_hub's ``from_pretrained`` takes it, for a private or gated repository (default:
        the token ``hf auth login`` stored, or ``HF_TOKEN``).
        """
        from captioning.storage.folder import read_folder
        from captioning.storage.hub import looks_like_hub_id
        from captioning.storage.load import load_model, model_of

        load_plugins()  # the folder may name a plugin's attention score, decoder kind or encoder
        name = os.fspath(name_or_path)
        if looks_like_hub_id(name):
            return cls.from_model(
                load_model(
                    name, revision=revision, local_files_only=local_files_only, cache_dir=cache_dir, token=token
                ),
                device,
            )
        return cls.from_model(model_of(read_folder(name)), device)  # a folder only, never a pickle

    def save_pretrained(self, folder: str | os.PathLike) -> str:
        """Write this model as a model folder (model.safetensors, config.json, vocab.json, README.md)."""
        import dataclasses

        from captioning.storage.folder import save_folder

        if self.spec is None:
            raise ValueError(
                "save_pretrained needs the model's spec: make the Captioner with from_checkpoint, "
                "from_pretrained, from_model or from_module"
            )
        if isinstance(self.model, Ensemble):
            raise ValueError("save_pretrained writes one model: save each member of an ensemble on its own")
        card = self.description.get("card") or {"training_data": self.description.get("training_data")}
        return str(save_folder(folder, self.model, card, dataclasses.replace(self.spec, image_size=self.image_size)))

    def push_to_hub(
        self,
        repo_id: str,
        private: bool | None = None,
        token: str | None = None,
        commit_message: str = "Upload a Show, Attend and Tell captioner",
    ) -> str:
        """Upload this model to the Hugging Face Hub as ``repo_id`` (``owner/name``, created if needed):
        the folder :meth:`save_pretrained` writes. Log in first (``hf auth login``) or pass ``token``.
        Returns the repository's URL; load it anywhere with ``Captioner.from_pretrained(repo_id)``."""
        import tempfile

        from captioning.storage.folder import push_to_hub

        with tempfile.TemporaryDirectory() as tmp:
            self.save_pretrained(tmp)
            return push_to_hub(tmp, repo_id, private=private, token=token, commit_message=commit_message)

    def describe(self) -> dict:
        """What the model is: attention kind, encoder, vocabulary size, image size (for people and pages);
        for an ensemble, its members and weights too; for a transformer, the layer whose
        cross-attention maps are returned (``attention_layer``: a number or "mean")."""
        return {
            "attention": self.attention_kind,
            "encoder": self.description.get("encoder"),
            "vocab_size": len(self.vocab),
            "image_size": self.image_size,
            "training_data": self.description.get("training_data"),
            "test_scores": self.description.get("test_scores"),
            **({"ensemble": self.description["ensemble"]} if self.description.get("ensemble") else {}),
            **attention_layer_field(self.model),
        }

    @torch.no_grad()
    def __call__(
        self,
        images: ImageInput | Sequence[ImageInput],
        return_attention: bool = False,
        batch_size: int = 16,
        generator: torch.Generator | None = None,
        focus: Any = None,
        focus_strength: float | None = None,
        return_views: bool = False,
        **generation,
    ) -> list[dict[str, Any]]:
        """Caption one image or a list of them, ``batch_size`` at a time.

        ``focus``: a box (x0, y0, x1, y1) in the images' own pixels (or one box or None per image)
        whose region the caption should describe: a prior added to every step's attention scores,
        ``focus_strength`` (default 10; 0: none) taken from the cells outside it
        (decoding/steering.py, docs/EVALUATION.md).

        ``generation``: any field of :class:`~captioning.decoding.generation.GenerationConfig`, over
        :attr:`generation` (a value out of bounds is a one-line ConfigError naming the field):

        {generation_options}

        Returns one dict per image: {"generated_text", "score", "tokens"}. With
        ``num_return_sequences`` > 1 also "beams": [{"generated_text", "score"}, ...] best first
        (with ``num_beam_groups`` > 1 each beam also has its "group", 1 to G).
        With ``return_attention`` also "attention": (T, gh, gw) float array (one map per token, EOS
        included) and "locations": the (row, col) cell each token looked at (the chosen cell of a
        hard model; the map's maximum for a soft one). A multi-head model's "attention" is the mean of
        its heads' maps, and "head_attention" (T, heads, gh, gw) holds each head's; a hard
        multi-head model's "locations" are the mean map's maxima and "head_locations" (T, heads)
        each head's chosen cell. An ensemble's "attention" is its members' weighted mean map (on the
        first member's grid) and "member_attention" (T, members, gh, gw) holds each member's map
        on that grid (an ensemble of one model: that model's maps only).

        With ``return_views`` also "views": the arrays the pictures of ``captioning attend --view``
        are drawn from, those the model has of :data:`VIEW_SHAPES` (:meth:`views` lists them).
        """
        config = self.generation.replace(**generation).resolve_tokens(self.vocab)  # suppress_tokens may name words
        single = not isinstance(images, (list, tuple))
        pils = [as_pil(im) for im in ([images] if single else images)]
        boxes, strength = focus_boxes(focus, len(pils), focus_strength)
        results = []
        for start in range(0, len(pils), batch_size):
            chunk = pils[start : start + batch_size]
            bias = None
            if boxes is not None:
                sizes = [p.size for p in chunk]
                names = [getattr(p, "filename", None) or f"image {start + i}" for i, p in enumerate(chunk)]
                bias = focus_biases(boxes[start : start + batch_size], sizes, self.grid_locations, strength, names)
            results += self._decode(
                self._batch(chunk), len(chunk), config, generator, return_attention, bias, return_views
            )
        return results

    @property
    def grid_locations(self) -> int | tuple[int, ...]:
        """L, the model's annotation vectors per image (from a blank image's encoding, once); an
        ensemble's: each member's."""
        if self._locations is None:
            blank = torch.zeros(1, 3, self.image_size, self.image_size, device=self.device)
            if isinstance(self.model, Ensemble):
                self._locations = tuple(int(f.size(1)) for f in self.model.encode(blank))
            else:
                self._locations = int(self.model.encoder(blank).size(1))
        return self._locations

    def _decode(
        self,
        batch,
        count: int,
        config: GenerationConfig,
        generator,
        return_attention: bool,
        bias=None,
        return_views: bool = False,
    ) -> list[dict]:
        """The results of one batch of model inputs (:meth:`_batch`'s) of ``count`` images; ``bias``
        (B, L): a focus prior on every step's attention (decoding/steering.py), None: none."""
        results = []
        out = generate_focused(self.model, batch, config, generator, bias)
        refined = self._refiner_maps(batch) if return_views else None
        for i in range(count):
            n = int(out.lengths[i])
            ids = out.sequences[i, :n].tolist()
            item: dict[str, Any] = {
                "generated_text": self.vocab.decode_text(ids),
                "score": float(out.scores[i]),
                "tokens": [self.vocab.itos[t] for t in ids],
            }
            if out.beam_sequences is not None:
                item["beams"] = [
                    {"generated_text": self.vocab.decode_text(seq), "score": float(score)}
                    for seq, score in zip(out.beam_sequences[i].tolist(), out.beam_scores[i].tolist())
                ]
                if (
                    config.num_beam_groups > 1 and out.beam_indices is not None
                ):  # diverse beam search: each beam's group
                    per_group = config.num_beams // config.num_beam_groups
                    for beam, row in zip(item["beams"], out.beam_indices[i].tolist()):
                        beam["group"] = row // per_group + 1
            if return_attention:
                grid = grid_shape(out.alphas.size(-1))
                item["attention"] = out.alphas[i, :n].reshape(n, *grid).cpu().numpy()
                if out.locations.dim() == 3:  # hard multi-head: a cell per head
                    item["head_locations"] = [
                        [divmod(int(cell), grid[1]) for cell in step] for step in out.locations[i, :n].tolist()
                    ]
                    item["locations"] = [divmod(int(cell), grid[1]) for cell in out.alphas[i, :n].argmax(-1).tolist()]
                else:
                    item["locations"] = [divmod(int(cell), grid[1]) for cell in out.locations[i, :n].tolist()]
                if out.head_alphas is not None:  # an ensemble's: each member's map; a multi-head model's: each head's
                    parts = out.head_alphas.size(2)
                    key = (
                        "member_attention"
                        if isinstance(self.model, Ensemble) and len(self.model.members) > 1
                        else "head_attention"
                    )
                    item[key] = out.head_alphas[i, :n].reshape(n, parts, *grid).cpu().numpy()
            if return_views:
                item["views"] = self._views_of(out, i, n, config, refined)
            results.append(item)
        return results

    def _views_of(self, out, i: int, n: int, config: GenerationConfig, refined) -> dict[str, np.ndarray]:
        """Image ``i``'s views (:data:`VIEW_SHAPES`) of a search's output, its ``n`` tokens."""
        views = {"alignment": out.alphas[i, :n].cpu().numpy()}
        for name, value in out.views.items():  # each step's: (T, ...); a Transformer's "self" cut to T positions
            value = value[i, :n]
            views[name] = (value[..., :n] if name == "self" else value).cpu().numpy()
        if self.attention_kind == "hard" and config.attention_mode == "sample":
            gw = grid_shape(out.alphas.size(-1))[1]
            cells = out.locations[i, :n].cpu()
            views["sample"] = torch.stack([cells // gw, cells % gw], -1).numpy()  # (T, 2), or (T, heads, 2)
        if refined is not None:
            views["refiner"] = refined[i]
        return views

    def _refiner(self):
        """The decoder's grid refiner (models/attention/refiner.py), or None (an ensemble's members
        are not shown one by one)."""
        if isinstance(self.model, Ensemble):
            return None
        decoder = getattr(self.model.decoder, "plain", self.model.decoder)  # the fast twin's plain decoder
        return getattr(decoder, "refiner", None)

    def _refiner_maps(self, batch) -> np.ndarray | None:
        """A grid refiner's self-attention maps of a batch (B, layers, heads, L, L), or None without one."""
        refiner = self._refiner()
        return None if refiner is None else refiner.maps(self.model.encoder(batch)).float().cpu().numpy()

    def views(self) -> tuple[str, ...]:
        """The views this model's results carry with ``return_views`` (:data:`VIEW_SHAPES`): "alignment",
        each step's views of its decoder (read from one step on a blank image, once), "refiner" with a
        grid refiner, "sample" for hard attention (decoded with ``attention_mode="sample"``)."""
        if self._views is None:
            names = ["alignment"]
            if not isinstance(self.model, Ensemble):
                blank = torch.zeros(1, 3, self.image_size, self.image_size, device=self.device)
                with torch.no_grad():
                    out = self.model.generate(images=blank, config=GenerationConfig(max_new_tokens=1))
                names += sorted(out.views)
                if self._refiner() is not None:
                    names.append("refiner")
                if self.attention_kind == "hard":
                    names.append("sample")
            self._views = tuple(names)
        return self._views

    @property
    def input_sizes(self) -> list[tuple[int, str]]:
        """(image size, interpolation) of each input the model takes: one, or one per ensemble member."""
        if isinstance(self.model, Ensemble):
            filters = [m.spec.interpolation or DEFAULT_INTERPOLATION for m in self.model.members]
            return list(zip(self.model.image_sizes, filters))
        return [(self.image_size, self.interpolation)]

    @torch.no_grad()
    def caption_pixels(
        self,
        pixels: Sequence[Sequence[np.ndarray]],
        return_attention: bool = False,
        generator: torch.Generator | None = None,
        focus: Any = None,
        focus_strength: float | None = None,
        sizes: Sequence[tuple[int, int]] | None = None,
        return_views: bool = False,
        **generation,
    ) -> list[dict[str, Any]]:
        """Caption one batch of images already resized: per image, one uint8 (3, S, S) array (or tensor,
        e.g. decoded on the GPU: data/images.py ``decode_entries``) per entry of :attr:`input_sizes`
        (data/inputs.py: ``model_pixels``). The same results as :meth:`__call__` on the images themselves.
        ``focus`` and ``focus_strength`` as for :meth:`__call__`, the boxes in the pixels of the images'
        own ``sizes`` ((W, H) each: the images are not here to tell them); ``return_views`` as there."""
        config = self.generation.replace(**generation).resolve_tokens(self.vocab)
        if not pixels:
            return []
        boxes, strength = focus_boxes(focus, len(pixels), focus_strength)
        bias = None
        if boxes is not None:
            if sizes is None or len(sizes) != len(pixels):
                raise ValueError("caption_pixels: a focus box needs the images' own sizes (sizes=[(W, H), ...])")
            bias = focus_biases(boxes, list(sizes), self.grid_locations, strength)

        def as_float(p) -> torch.Tensor:
            if isinstance(p, torch.Tensor):
                return p.to(self.device).float().div_(255.0)
            return torch.from_numpy(pixels_to_float(p)).to(self.device)

        inputs = [torch.stack([as_float(p[k]) for p in pixels]) for k in range(len(self.input_sizes))]
        batch = inputs if isinstance(self.model, Ensemble) else inputs[0]
        return self._decode(batch, len(pixels), config, generator, return_attention, bias, return_views)

    def caption_files(
        self,
        paths: str | os.PathLike | Iterable[str | os.PathLike],
        batch_size: int = 16,
        num_workers: int = 0,
        return_attention: bool = False,
        generator: torch.Generator | None = None,
        skip: Container[str] = (),
        decode_device: str | None = None,
        **generation,
    ) -> Iterator[dict[str, Any]]:
        """Caption image files as a stream, yielding one result per image in input order.

        ``paths``: files, folders (with their subfolders), glob patterns, ``@list.txt`` files and
        WebDataset shards (data/inputs.py); a generator of paths is read as it goes. Images are read
        ``batch_size`` at a time by ``num_workers`` loader processes (0: this one), so memory is
        bounded by the batch and the read-ahead, never by the number of images. ``skip``: names not
        to caption (e.g. those of an earlier run). ``decode_device`` (``"cuda"``): JPEGs are decoded and
        resized on that GPU instead of by the loader (data/images.py; one-line ConfigError without CUDA).
        ``generation`` as for :meth:`__call__`.

        Yields {"image": name, "generated_text", "score", "tokens", ...} (the keys of
        :meth:`__call__`), or {"image": name, "error": one line} for an image that cannot be read and
        for an argument that names none.
        """
        from captioning.data.images import decode_entries
        from captioning.data.inputs import Loaded, iter_sources, load_batches, model_pixels_of

        items = [paths] if isinstance(paths, (str, os.PathLike)) else paths
        self.generation.replace(**generation)  # a bad setting: one line now, before any image is read
        device = self.check_decode_device(decode_device) if decode_device is not None else None
        sources = (s for s in iter_sources(map(os.fspath, items), inline=True) if s.name not in skip)
        prepare = model_pixels_of(self.input_sizes)
        for batch in load_batches(sources, prepare, batch_size, num_workers, encoded=device is not None):
            if device is not None:
                good = [b for b in batch if b.error is None]
                images, errors = decode_entries(
                    [b.image for b in good], [b.name for b in good], self.input_sizes, device
                )
                fixed = iter(Loaded(b.name, im, e) for b, im, e in zip(good, images, errors))
                batch = [next(fixed) if b.error is None else b for b in batch]
            good = [b for b in batch if b.error is None]
            results = iter(self.caption_pixels([b.image for b in good], return_attention, generator, **generation))
            for b in batch:
                yield {"image": b.name, "error": b.error} if b.error else {"image": b.name, **next(results)}

    def check_decode_device(self, device):
        """The torch device of ``device`` for decoding JPEGs on a GPU (``caption --decode-device``), or
        None for the CPU; one-line ConfigError without CUDA or for a resize the GPU does not reproduce."""
        from captioning.data.images import check_decode_device

        parsed = None
        for _, interpolation in self.input_sizes:
            parsed = check_decode_device(device, "--decode-device", interpolation)
        return parsed

    def _batch(self, images: Sequence[Image.Image]):
        """The model's input (B, 3, S, S) on its device, resized with the model's interpolation; an
        ensemble's: one batch per member, at its size and with its interpolation."""
        if isinstance(self.model, Ensemble):
            filters = [m.spec.interpolation or DEFAULT_INTERPOLATION for m in self.model.members]
            return [
                torch.stack([to_tensor(im, size, f) for im in images]).to(self.device)
                for size, f in zip(self.model.image_sizes, filters)
            ]
        return torch.stack([to_tensor(im, self.image_size, self.interpolation) for im in images]).to(self.device)

    def render(
        self,
        image: ImageInput,
        result: dict | None = None,
        path: str | os.PathLike | None = None,
        format: str | None = None,
        duration_ms: int = 800,
        alpha: float = 0.6,
        style: str = "heatmap",
        heads: str = "mean",
        members: str = "mean",
        view: str = "maps",
        **generate_kwargs,
    ):
        """Attention overlays for one image: a GIF (frame per word + the whole caption) or a grid PNG.

        Without ``result`` the image is captioned first (``generate_kwargs`` as for __call__).
        With ``path`` the file is written and its path returned (``format`` None: the path's suffix
        says, .png a grid, else a GIF). Without a path: ``format="gif"`` returns the GIF's bytes
        (``IPython.display.Image(data=...)`` shows it in a notebook), ``"png"`` the grid as a PIL image,
        None the GIF's frames as PIL images. Hard-attention models show the chosen cell
        sharply over a faint soft map. A multi-head model shows the mean of its heads' maps
        (``heads="mean"``) or one picture per head (``heads="each"``: the GIF's frames side by side,
        the grids one under another). An ensemble shows its members' weighted mean map, titled so
        (``members="mean"``), or one picture per member, titled with its file and weight
        (``members="each"``).

        ``view`` (viz/views.py): "maps" (the above), "alignment" (the word-by-location matrix) and
        "self" (self-attention matrices), drawn as one PNG, or "gate", "window", "sample" drawn on
        each word's map; a view the model lacks is a one-line ConfigError naming those it has.
        """
        from captioning.viz import pictures as visualize
        from captioning.viz.views import MATRIX_VIEWS, VIEWS

        if heads not in ("mean", "each"):
            raise ValueError(f"heads must be 'mean' or 'each', got {heads!r}")
        if members not in ("mean", "each"):
            raise ValueError(f"members must be 'mean' or 'each', got {members!r}")
        if format not in (None, "gif", "png"):
            raise ValueError(f"format must be 'gif' or 'png', got {format!r}")
        if view not in VIEWS:
            raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
        if view in MATRIX_VIEWS and (format == "gif" or str(path or "").lower().endswith(".gif")):
            raise ConfigError(f"view {view}: a matrix, drawn as a PNG (format 'png'), not a GIF")
        kind = format or (
            "png" if view in MATRIX_VIEWS or (path is not None and str(path).lower().endswith(".png")) else "gif"
        )
        pil = as_pil(image)
        if view != "maps":
            self.check_view(view)
            if view == "sample":  # the sampled cells: hard attention decoded with sampled locations
                generate_kwargs.setdefault("attention_mode", "sample")
        if result is not None and view != "maps" and "views" not in result:
            raise ConfigError(f"view {view}: this result has no views; caption with return_views=True")
        if result is None or "attention" not in result:
            result = self(pil, return_attention=True, return_views=view != "maps", **generate_kwargs)[0]
        words, maps, cells = list(result["tokens"]), result["attention"], list(result["locations"])
        if words and words[-1] == self.vocab.EOS:  # a frame per word: the end token gets none
            words, maps, cells = words[:-1], maps[:-1], cells[:-1]
        hard_cells = cells if self.attention_kind == "hard" else None
        if view != "maps":
            picture = self._render_view(pil, words, maps, result, view, kind, alpha, style)
        elif heads == "each" and "head_attention" in result:
            picture = self._render_heads(pil, words, result, kind, alpha, style)
        elif "member_attention" in result:
            picture = self._render_members(pil, words, result, hard_cells, kind, alpha, style, members)
        else:
            render = visualize.render_frames if kind == "gif" else visualize.render_grid
            picture = render(pil, words, maps, hard_cells=hard_cells, alpha=alpha, style=style)
        if kind == "gif":
            if path is not None:
                return visualize.save_frames(picture, path, duration_ms)
            return visualize.gif_bytes(picture, duration_ms) if format == "gif" else picture
        return picture if path is None else visualize.save_png(picture, path)

    def check_view(self, view: str, option: str = "view") -> None:
        """A one-line ConfigError when this model cannot draw ``view`` (viz/views.py: VIEWS), naming
        the views it has."""
        from captioning.viz.views import missing_view

        problem = missing_view(view, self.views(), option)
        if problem is not None:
            raise ConfigError(problem)

    def _render_view(self, pil, words, maps, result, view, kind, alpha, style):
        """render(view=...): a matrix PNG, or each word's map decorated (a GIF's frames or a grid)."""
        from captioning.viz import pictures as visualize
        from captioning.viz import views as V

        views = {k: (v[: len(words)] if k != "refiner" else v) for k, v in (result.get("views") or {}).items()}
        problem = V.missing_view(view, list(views), "view")
        if problem is not None:
            if view == "sample" and self.attention_kind == "hard":
                problem = "view sample: this result was not decoded with attention_mode='sample' (no sampled cells)"
            raise ConfigError(problem)
        if view == "alignment":
            return V.alignment_picture(pil, words, np.asarray(views["alignment"]).reshape(maps.shape))
        if view == "self":
            return V.self_attention_picture(pil, words, views)
        if view == "gate":
            decorate = V.gate_decoration(views["gate"])
        elif view == "window":
            decorate = V.window_decoration(views["window"], tuple(maps.shape[1:]))
        else:
            decorate = V.sample_decoration(pil, maps, views["sample"], alpha=alpha, style=style)
        render = visualize.render_frames if kind == "gif" else visualize.render_grid
        return render(pil, words, maps, alpha=alpha, style=style, decorate=decorate)

    def member_labels(self) -> list[str]:
        """An ensemble's members as its pictures title them: file name and weight."""
        from captioning.decoding.ensemble import short_names

        return [f"{name} (weight {w:.2f})" for name, w in zip(short_names(self.model.names), self.model.weights)]

    def _render_members(self, pil, words, result, hard_cells, kind, alpha, style, members):
        """render() of an ensemble: the members' weighted mean map under a title saying so, or one
        picture per member (the GIF's frames side by side, the grids one under another), titled."""
        from captioning.viz import pictures as visualize

        render = visualize.render_frames if kind == "gif" else visualize.render_grid
        if members == "mean":
            pictures = [
                render(pil, words, result["attention"][: len(words)], hard_cells=hard_cells, alpha=alpha, style=style)
            ]
            labels = [f"weighted mean of {len(self.model.members)} models' maps"]
        else:
            maps = result["member_attention"][: len(words)]  # (T, members, gh, gw)
            pictures = [render(pil, words, maps[:, k], alpha=alpha, style=style) for k in range(maps.shape[1])]
            labels = self.member_labels()
        return _stacked(pictures, labels, kind)

    def _render_heads(self, pil, words, result, kind, alpha, style):
        """render(heads="each"): one picture per head, labelled."""
        from captioning.viz import pictures as visualize

        maps = result["head_attention"][: len(words)]  # (T, heads, gh, gw)
        cells = result.get("head_locations")
        labels = [f"head {k + 1}" for k in range(maps.shape[1])]
        per_head = []
        for k in range(maps.shape[1]):
            hard = [step[k] for step in cells[: len(words)]] if cells is not None else None
            render = visualize.render_frames if kind == "gif" else visualize.render_grid
            per_head.append(render(pil, words, maps[:, k], hard_cells=hard, alpha=alpha, style=style))
        return _stacked(per_head, labels, kind)


def _stacked(pictures: list, labels: list[str], kind: str):
    """Labelled pictures together: GIFs' frames side by side (a list of frames), grids one under another."""
    from captioning.viz import pictures as visualize

    if kind == "gif":
        return [visualize.labelled_stack(list(frame), labels, horizontal=True) for frame in zip(*pictures)]
    return visualize.labelled_stack(pictures, labels, horizontal=False)


def _options_doc(doc: str | None) -> str | None:
    """``doc`` with its ``{generation_options}`` line replaced by one line per decoding option
    (decoding/generation.py: the fields' metadata), indented as the line was (None under -OO)."""
    marker = "{generation_options}"
    if doc is None:
        return None
    indent = next(line[: line.index(marker)] for line in doc.splitlines() if marker in line)
    lines = [f"- {o.name} ({o.expected()}; default {o.default!r}): {o.help}" for o in generation_options()]
    return doc.replace(marker, ("\n" + indent).join(lines))


_CALL_DOC = Captioner.__call__.__doc__
Captioner.__call__.__doc__ = _options_doc(_CALL_DOC)
when_options_change(lambda: setattr(Captioner.__call__, "__doc__", _options_doc(_CALL_DOC)))  # a plugin's options
