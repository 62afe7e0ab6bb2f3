"""The models behind the web page and the HTTP API, and the one queue every request goes through.

Nothing here knows about HTTP: :class:`ServedModel` wraps a :class:`~captioning.api.Captioner`
(its description, its example images, a request's generation settings checked and turned into
arguments, a result turned into JSON) and :class:`InferenceQueue` runs all the work of all the
models on one worker thread:

* **bounded**: at most ``max_pending`` requests wait; one more is refused with :class:`Busy`
  (HTTP 503) instead of piling up. Memory stays flat under load because a waiting request holds
  only its upload, in a temporary file on disk; images are decoded by the worker, one batch at a
  time, and shrunk at once to what is needed (the model's S x S input and a display copy).
* **batched**: the worker takes the oldest request and every other waiting request for the same
  model with the same settings (up to ``max_batch``) and captions them in one call, so that
  simultaneous requests share the beam search's matrix products. GIFs and display images are
  made on a second thread, so the model goes on with the next batch meanwhile; at most
  ``max_render`` requests wait for it (one more is refused with :class:`Busy`), and a GIF is
  drawn within a pixel budget (frames x width x height), shrunk to fit it.
* **isolated**: a request fails alone. An unreadable upload is its own 4xx; when the model fails
  on a batch, each of its requests is tried alone, so only the request that fails it gets a 500
  (a generic message; the detail goes to the server's log).
* **watched**: :meth:`InferenceQueue.health` tells how long the worker (and the drawing thread)
  have been on their current work, for ``/healthz`` to report a stuck worker.
"""
from __future__ import annotations

import base64
import collections
import io
import logging
import math
import re
import os
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from PIL import Image

from captioning.errors import CaptioningError

ATTENTION_MODES = ("expected", "argmax", "sample")
MAX_BEAMS = 10
MAX_TOKENS = 100  # the cap of max_new_tokens, asked for or the model's own default
DISPLAY_SIDE = 400  # the longest side of the image kept for the GIF and the page (the GIF's frames: 400 x 300 for 4:3)
EXAMPLES = 8  # example images offered on the page at most
DEFAULT_MAX_RENDER = 16  # requests waiting for their GIF / display image at most
DEFAULT_GIF_PIXELS = 8_000_000  # frames x width x height of one GIF at most (about 24 MB of frames as RGB)
MIN_GIF_SIDE = 48  # a GIF is never shrunk below this long side to fit the budget; it is left out instead
CONFIG_BYTES = 1 << 20  # a run's config.yaml larger than this is not read (it names a few paths)

log = logging.getLogger("captioning.web")


class RequestError(CaptioningError):
    """A request the server cannot answer: its HTTP status and a one-line message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Busy(RequestError):
    """Too many requests are waiting: come back later (HTTP 503)."""

    def __init__(self, message: str):
        super().__init__(message, 503)


class InternalError(RequestError):
    """The server failed on a request (HTTP 500): a generic message; the detail is logged."""

    def __init__(self, what: str = "the model failed on this request"):
        super().__init__(f"internal error: {what} (the server's log has the detail)", 500)


# ---------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    """A request's generation settings; ``None`` means the model's own default."""

    num_beams: int = 3
    max_new_tokens: Optional[int] = None
    length_penalty: Optional[float] = None
    attention_mode: Optional[str] = None
    num_return_sequences: Optional[int] = None  # top beams to list (default: all of them, at most 5)
    num_beam_groups: int = 1  # diverse beam search: groups of num_beams / groups beams, listed side by side
    diversity_penalty: Optional[float] = None  # the groups' penalty (default 0.5 with groups)

    @classmethod
    def parse(cls, fields: dict, hard: bool) -> "Settings":
        """Settings from form fields (strings); a :class:`RequestError` names the first bad one.

        ``attention_mode`` only means something to a hard-attention model and is ignored otherwise.
        """

        def number(name, kind, low, high):
            raw = fields.get(name)
            if raw is None or str(raw).strip() == "":
                return None
            try:
                value = kind(str(raw).strip())
            except ValueError:
                raise RequestError(f"{name}: expected {'an integer' if kind is int else 'a number'}, got {str(raw)[:40]!r}") from None
            if not (low <= value <= high) or (kind is float and not math.isfinite(value)):
                raise RequestError(f"{name}: must be between {low} and {high}, got {value}")
            return value

        beams = number("num_beams", int, 1, MAX_BEAMS)
        beams = 3 if beams is None else beams
        mode = str(fields.get("attention_mode") or "").strip() or None
        if mode is not None and mode not in ATTENTION_MODES:
            raise RequestError(f"attention_mode: expected one of {', '.join(ATTENTION_MODES)}, got {mode[:40]!r}")
        groups = number("num_beam_groups", int, 1, beams) or 1
        if beams % groups:
            raise RequestError(f"num_beam_groups: must divide num_beams ({beams}), got {groups}")
        penalty = number("diversity_penalty", float, 0.0, 10.0)
        if penalty is not None and groups == 1:
            raise RequestError("diversity_penalty: needs num_beam_groups > 1 (diverse beam search)")
        if penalty is not None and penalty <= 0:
            raise RequestError(f"diversity_penalty: must be above 0, got {penalty}")
        return cls(
            num_beams=beams,
            max_new_tokens=number("max_new_tokens", int, 1, MAX_TOKENS),
            length_penalty=number("length_penalty", float, -5.0, 5.0),
            attention_mode=mode if hard else None,
            num_return_sequences=number("num_return_sequences", int, 1, beams),
            num_beam_groups=groups,
            diversity_penalty=(0.5 if penalty is None else penalty) if groups > 1 else None,
        )

    def as_dict(self) -> dict:
        return {"num_beams": self.num_beams, "max_new_tokens": self.max_new_tokens,
                "length_penalty": self.length_penalty, "attention_mode": self.attention_mode,
                "num_return_sequences": self.num_return_sequences, "num_beam_groups": self.num_beam_groups,
                "diversity_penalty": self.diversity_penalty}


def truthy(value) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------------- a served model
def _jsonable(value):
    """Plain JSON types (numpy and torch scalars to floats, tuples to lists), recursively."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


def _training_config(checkpoint: Path) -> Optional[dict]:
    """The data fields (``annotations``, ``images_root``, ``split_file``) of the ``config.yaml``
    LightningCLI wrote for the checkpoint's run, or None.

    Only the layout Lightning writes is looked at: a checkpoint in a ``checkpoints`` folder, the
    config beside that folder (``<run>/checkpoints/x.ckpt`` -> ``<run>/config.yaml``, where ``<run>``
    is ``lightning_logs/version_N`` or the run's root without a logger). No other folder above the
    checkpoint is searched, files over :data:`CONFIG_BYTES` are not read, and nothing but those
    three fields is kept.
    """
    import yaml

    checkpoint = Path(checkpoint)
    if checkpoint.parent.name != "checkpoints" or not checkpoint.is_file():
        return None
    path = checkpoint.parent.parent / "config.yaml"
    try:
        if not path.is_file() or path.stat().st_size > CONFIG_BYTES:
            return None
        with open(path) as f:
            config = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    data = config.get("data") if isinstance(config, dict) else None
    if not isinstance(data, dict):
        return None
    fields = {}
    annotations = data.get("annotations")
    if isinstance(annotations, str) or (isinstance(annotations, list) and annotations
                                        and all(isinstance(a, str) for a in annotations)):
        fields["annotations"] = annotations
    for name in ("images_root", "split_file"):
        if isinstance(data.get(name), str):
            fields[name] = data[name]
    return {"data": fields}


def is_image_file(path: Path) -> bool:
    """Whether ``path`` is a file of an image suffix that :func:`~captioning.data.images.load_image` reads."""
    from captioning.data.images import IMAGE_SUFFIXES, load_image
    from captioning.errors import ImageError

    if path.suffix.lower() not in IMAGE_SUFFIXES or not path.is_file():
        return False
    try:
        load_image(path)
    except ImageError:
        return False
    return True


def _within(path: Path, root: Path) -> bool:
    """Whether ``path``, links resolved, lies under the folder ``root``."""
    try:
        path.resolve().relative_to(root.resolve())
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def _test_images(config: Optional[dict], limit: int = EXAMPLES, max_mb: float = 64) -> list[Path]:
    """The first test-split images of the data a model was trained on (what the demo model was tested on).

    Annotation files over ``max_mb`` in all are not read (COCO's would cost seconds and a GB at start).
    """
    data = (config or {}).get("data") or {}
    annotations = data.get("annotations")
    if not annotations:
        return []
    try:
        from captioning.data.formats import load_records

        files = annotations if isinstance(annotations, list) else [annotations]
        if sum(os.path.getsize(f) for f in files) > max_mb * 1024 * 1024:
            return []
        first = files[0]
        root = Path(data.get("images_root") or Path(first).resolve().parent)
        records = [r for r in load_records(annotations, data.get("split_file")) if r.split == "test"]
        paths = [root / r.path for r in records[:limit]]
        return [p for p in paths if _within(p, root) and is_image_file(p)]
    except Exception:  # noqa: BLE001 - examples are a convenience: a moved dataset just has none
        return []


def ensemble_members(path: str) -> list[str]:
    """``A+B+...`` -> the members of an ensemble served as one model; a path that exists as given
    (or has no ``+``) is one model."""
    if "+" not in path or Path(path).exists():
        return [path]
    return [part for part in path.split("+") if part]


class ServedModel:
    """One checkpoint behind the page: the captioner, its description and example images."""

    def __init__(self, name: str, captioner, checkpoint: Optional[Path] = None, examples: Sequence[Path] = ()):
        self.name = name
        self.captioner = captioner
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.hard = getattr(captioner, "attention_kind", "soft") == "hard"
        config = _training_config(self.checkpoint) if self.checkpoint is not None else None
        self.examples = list(examples) or _test_images(config)
        self.description = self._describe(config)
        self.returns_beams = True  # Captioner takes num_return_sequences
        self.grid: Optional[tuple[int, int]] = None

    @classmethod
    def load(cls, name: Optional[str], checkpoint, device: str = "cpu", examples: Sequence[Path] = ()) -> "ServedModel":
        from captioning.api import Captioner

        members = ensemble_members(str(checkpoint))
        if len(members) > 1:  # A+B: an ensemble, one model on the page (its training config: the first member's)
            return cls(name or "", Captioner.from_checkpoints(members, device=device), Path(members[0]), examples)
        captioner = Captioner.from_checkpoint(checkpoint, device=device)
        return cls(name or "", captioner, Path(checkpoint), examples)

    def _describe(self, config: Optional[dict]) -> dict:
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
        return _jsonable(info)

    def max_new_tokens(self, settings: Settings) -> int:
        """The request's maximum length, or the model's own, never over :data:`MAX_TOKENS`."""
        own = getattr(self.captioner.generation, "max_new_tokens", None) or MAX_TOKENS
        return min(settings.max_new_tokens or int(own), MAX_TOKENS)

    def defaults(self) -> dict:
        g = self.captioner.generation
        return _jsonable({"num_beams": 3, "max_new_tokens": self.max_new_tokens(Settings()),
                          "length_penalty": g.length_penalty, "attention_mode": g.attention_mode if self.hard else None})

    def info(self) -> dict:
        """What GET /api/models tells about this model."""
        return {"name": self.name, "description": self.description, "defaults": self.defaults(),
                "grid": list(self.grid) if self.grid else None, "returns_beams": self.returns_beams,
                "attention_modes": list(ATTENTION_MODES) if self.hard else []}

    # ------------------------------------------------------------------ work
    def caption(self, images: list[Image.Image], settings: Settings) -> list[dict]:
        """Raw results of the captioner (numpy attention), one per image, with "beams" always present."""
        kwargs: dict[str, Any] = dict(num_beams=settings.num_beams, max_new_tokens=self.max_new_tokens(settings),
                                      length_penalty=settings.length_penalty, return_attention=True)
        if self.hard:
            kwargs["attention_mode"] = settings.attention_mode
        if settings.num_beam_groups > 1:  # every beam listed, so that each group's captions show side by side
            kwargs.update(num_beam_groups=settings.num_beam_groups, diversity_penalty=settings.diversity_penalty)
        if self.returns_beams:
            every = settings.num_beams if settings.num_beam_groups > 1 else min(settings.num_beams, 5)
            kwargs["num_return_sequences"] = settings.num_return_sequences or every
        results = self.captioner(images, **kwargs)
        for result in results:
            if not result.get("beams"):  # an API without num_return_sequences: the best beam only
                result["beams"] = [{"generated_text": result["generated_text"], "score": result["score"]}]
            if self.grid is None and result.get("attention") is not None:
                self.grid = tuple(int(n) for n in np.shape(result["attention"])[1:])
        return results

    def gif(self, image: Image.Image, result: dict, max_pixels: int = DEFAULT_GIF_PIXELS) -> tuple[Optional[bytes], dict]:
        """The attention GIF (a frame per word, then the whole caption) of one result, within
        ``max_pixels`` (frames x width x height, the caption band included) and its description:
        ``{"frames", "width", "height", "shrunk", "budget_pixels"}``. Over the budget the frames are
        shrunk to fit it; when that would make them smaller than :data:`MIN_GIF_SIDE`, no GIF
        (None) and ``"left_out"`` says why. The frames are the ones ``Captioner.render`` draws."""
        from captioning.viz import pictures

        words, maps, cells = list(result["tokens"]), result["attention"], list(result["locations"])
        if words and words[-1] == self.captioner.vocab.EOS:  # a frame per word: the end token gets none
            words, maps, cells = words[:-1], maps[:-1], cells[:-1]
        frames = len(words) + 1
        # the size Captioner.render draws at: short side at least 256 (small images enlarged), long side at most 640
        width, height = image.size
        scale = min(max(1.0, 256 / min(width, height)), 640 / max(width, height))
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
        info: dict[str, Any] = {"frames": frames, "budget_pixels": int(max_pixels), "shrunk": False}
        for _ in range(8):  # shrink until the frames, caption band included, fit the budget
            total = frames * width * (height + _caption_band(words, width))
            if total <= max_pixels:
                break
            fit = math.sqrt(max_pixels / total) * 0.98
            width, height = max(1, int(width * fit)), max(1, int(height * fit))
            info["shrunk"] = True
        if total > max_pixels or max(width, height) < MIN_GIF_SIDE:
            info["left_out"] = (f"{frames} frames do not fit the server's GIF budget of {max_pixels:,} pixels "
                                f"at {MIN_GIF_SIDE} px or more")
            return None, info
        if info["shrunk"]:
            image = image.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
        drawn = pictures.render_frames(image, words, maps, hard_cells=cells if self.hard else None,
                                       min_side=min(width, height), max_side=max(width, height))
        info["width"], info["height"] = drawn[0].size
        return gif_bytes(drawn), info

    def to_json(self, result: dict) -> dict:
        """A result in the API's JSON: text, score, tokens, per-token maps (4 decimals), cells, beams."""
        attention = np.asarray(result["attention"], dtype=np.float64)
        return {
            "model": self.name,
            "generated_text": result["generated_text"],
            "score": _jsonable(float(result["score"])),
            "tokens": list(result["tokens"]),
            "attention": np.round(attention, 4).tolist(),
            "attention_shape": list(attention.shape),
            "locations": [[int(r), int(c)] for r, c in result["locations"]],
            "attention_kind": "hard" if self.hard else "soft",
            "beams": [{"generated_text": b["generated_text"], "score": _jsonable(float(b["score"]))}
                      for b in result["beams"]],
        }


# ---------------------------------------------------------------------- images
def _caption_band(words: Sequence[str], width: int) -> int:
    """The height of the caption band ``captioning.viz.pictures.render_frames`` draws under a
    ``width``-pixel picture (its font, padding and line breaking)."""
    from captioning.viz import pictures

    font = pictures.ui_font(int(np.clip(width / 14, 14, 26)))
    pad = max(6, width // 40)
    lines = pictures._wrap(words, font, width - 2 * pad)
    return pad * 2 + pictures._line_height(font) * max(1, len(lines))


def gif_bytes(frames: Sequence[Image.Image], duration_ms: int = 800) -> bytes:
    """Frames as the bytes of a GIF that loops forever (the palette ``save_frames`` uses)."""
    quantized = [f.quantize(256, method=Image.Quantize.FASTOCTREE) for f in frames]
    buffer = io.BytesIO()
    quantized[0].save(buffer, format="GIF", save_all=True, append_images=quantized[1:], duration=int(duration_ms), loop=0)
    return buffer.getvalue()


def _file_names(value):
    """A training-data path (or list of them) reduced to file names: a server's folders are not shown."""
    if isinstance(value, (list, tuple)):
        return [_file_names(v) for v in value]
    if isinstance(value, (str, os.PathLike)):
        return Path(value).name or str(value)
    return value


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def encode_display(image: Image.Image) -> str:
    """The image as the model read it (oriented, RGB), for the page to draw the maps on: PNG when small, else JPEG."""
    buffer = io.BytesIO()
    if image.width * image.height <= 256 * 256:
        image.save(buffer, "PNG")
        return data_uri(buffer.getvalue(), "image/png")
    image.save(buffer, "JPEG", quality=90)
    return data_uri(buffer.getvalue(), "image/jpeg")


def prepare(path: str, image_size: int, interpolation: str = "bilinear") -> tuple[Image.Image, Image.Image, tuple[int, int]]:
    """Read an upload safely and shrink it at once: (model input S x S, display copy, original (W, H)).

    The model input is resized exactly as ``captioning.data.images.to_tensor`` resizes (with the
    model's ``interpolation``), so the caption is the one the original image gets. Memory: reading an image peaks at about 3.8 times
    its size as RGB (measured for JPEG and PNG: 280 MB for the default --max-pixels of 24
    megapixels, 580 MB for 50 megapixels; 16-bit images less, converted in bands); the worker
    reads one upload at a time, so that is the bound of the whole server's decoding.
    """
    from captioning.data.images import INTERPOLATIONS, check_interpolation, load_image

    image = load_image(path)  # bomb guard, EXIF orientation, any mode -> RGB; ImageError otherwise
    size = image.size
    model_input = image.resize((image_size, image_size), INTERPOLATIONS[check_interpolation(interpolation)])
    display = image
    if max(size) > DISPLAY_SIDE:  # resized from the image itself: no full-size copy
        scale = DISPLAY_SIDE / max(size)
        shown = (max(1, round(size[0] * scale)), max(1, round(size[1] * scale)))
        display = image.resize(shown, Image.Resampling.LANCZOS, reducing_gap=2.0)
    del image
    return model_input, display, size


# ---------------------------------------------------------------------- the queue
@dataclass
class Job:
    model: ServedModel
    settings: Settings
    upload: str  # a temporary file holding the uploaded bytes
    filename: str  # the client's name for it, for messages
    want_gif: bool = False
    want_image: bool = False
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.perf_counter)


class InferenceQueue:
    """One worker thread, at most ``max_pending`` waiting requests, batches of up to ``max_batch``;
    one drawing thread, at most ``max_render`` requests waiting for it, GIFs within ``max_gif_pixels``."""

    def __init__(self, max_batch: int = 8, max_pending: int = 64, workdir: Optional[str] = None,
                 max_render: int = DEFAULT_MAX_RENDER, max_gif_pixels: int = DEFAULT_GIF_PIXELS):
        if max_batch < 1 or max_pending < 1 or max_render < 1 or max_gif_pixels < 1:
            raise ValueError("max_batch, max_pending, max_render and max_gif_pixels must be at least 1")
        self.max_batch, self.max_pending, self.max_render = max_batch, max_pending, max_render
        self.max_gif_pixels = max_gif_pixels
        self.workdir = workdir or tempfile.gettempdir()
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0  # how many model calls were made (for tests and the health check)
        self.largest_batch = 0
        # when the worker and the drawing thread started their current work (None: idle), for health()
        self._busy_since: dict[str, Optional[float]] = {"worker": None, "render": None}
        self._rendering = 0  # requests handed to the drawing thread and not finished
        # GIFs and display images are made on a second thread, one at a time (their inputs are small)
        self._render = ThreadPoolExecutor(1, thread_name_prefix="captioning-render")
        self._thread = threading.Thread(target=self._run, name="captioning-inference", daemon=True)
        self._thread.start()

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs)

    def rendering(self) -> int:
        with self._cond:
            return self._rendering

    def health(self, stuck_after: float) -> dict:
        """``{"stuck": bool, "worker_busy_s": s, "render_busy_s": s, "worker_alive": bool}``: stuck when
        the worker thread has died or the worker or the drawing thread has been on one piece of
        work for more than ``stuck_after`` seconds."""
        now = time.monotonic()
        with self._cond:
            busy = {name: (0.0 if since is None else now - since) for name, since in self._busy_since.items()}
        alive = self._thread.is_alive() or self._closed
        return {"stuck": not alive or max(busy.values()) > stuck_after, "worker_alive": alive,
                "worker_busy_s": round(busy["worker"], 1), "render_busy_s": round(busy["render"], 1)}

    def _mark(self, name: str, busy: bool) -> None:
        with self._cond:
            self._busy_since[name] = time.monotonic() if busy else None

    def submit(self, job: Job) -> Future:
        with self._cond:
            if self._closed:
                raise Busy("the server is shutting down")
            if len(self._jobs) >= self.max_pending:
                raise Busy(f"too many requests waiting ({self.max_pending}); try again in a moment")
            self._jobs.append(job)
            self._cond.notify()
        return job.future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            waiting, self._jobs = list(self._jobs), collections.deque()
            self._cond.notify_all()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(Busy("the server is shutting down"))
        self._thread.join(timeout=30)
        self._render.shutdown(wait=True, cancel_futures=False)

    def _take(self) -> Optional[list[Job]]:
        """The oldest job and the waiting jobs that can share its model call."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = self._jobs.popleft()
            batch, rest = [first], collections.deque()
            while self._jobs:
                job = self._jobs.popleft()
                if len(batch) < self.max_batch and job.model is first.model and job.settings == first.settings:
                    batch.append(job)
                else:
                    rest.append(job)
            self._jobs = rest
            self._busy_since["worker"] = time.monotonic()
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._process(batch)
            except BaseException as err:  # noqa: BLE001 - the worker must survive anything one batch does
                log.error("a batch of %d failed", len(batch), exc_info=err)
                for job in batch:
                    _fail(job, InternalError())
            finally:
                self._mark("worker", False)

    def _prepare(self, job: Job, image_size: int, interpolation: str) -> Optional[tuple]:
        """(job, model input, display copy, (W, H)), or None with the job answered with its error."""
        from captioning.errors import ImageError

        try:
            return (job, *prepare(job.upload, image_size, interpolation))
        except ImageError as err:
            message = client_message(str(err), job.upload, job.filename)
            _fail(job, RequestError(message, _image_error_status(message)))
        except MemoryError:
            _fail(job, RequestError(f"{job.filename}: image too large to decode", 413))
        except Exception as err:  # noqa: BLE001 - one upload's failure is its own
            log.error("%s: reading the upload failed", job.filename, exc_info=err)
            _fail(job, InternalError("the server could not read this image"))
        return None

    def _caption(self, model: ServedModel, ready: list[tuple], settings: Settings) -> list[tuple]:
        """(job, result) of each request the model captions; when the batch fails, each request is
        tried alone, so that only the ones the model fails on get a 500."""
        try:
            return list(zip(ready, model.caption([inputs for _, inputs, _, _ in ready], settings)))
        except Exception as err:  # noqa: BLE001 - answered as a 500; the worker goes on
            if len(ready) == 1:
                log.error("%s: captioning failed", ready[0][0].filename, exc_info=err)
                _fail(ready[0][0], InternalError())
                return []
        done = []
        for item in ready:
            done += self._caption(model, [item], settings)
        return done

    def _process(self, batch: list[Job]) -> None:
        start = time.perf_counter()
        model = batch[0].model
        image_size = int(getattr(model.captioner, "image_size", None) or model.description.get("image_size") or 224)
        interpolation = getattr(model.captioner, "interpolation", None) or "bilinear"
        ready = [item for job in batch if job.future.set_running_or_notify_cancel()
                 for item in [self._prepare(job, image_size, interpolation)] if item is not None]
        decoded = time.perf_counter()
        if not ready:
            return
        captioned_ = self._caption(model, ready, batch[0].settings)
        captioned = time.perf_counter()
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(ready))
        for (job, _, display, size), result in captioned_:
            try:
                payload = model.to_json(result)
                payload["settings"] = job.settings.as_dict()
                payload["image_size"] = list(size)
                payload["timing_ms"] = {
                    "queue": round((start - job.queued_at) * 1000, 1),
                    "decode": round((decoded - start) * 1000, 1),
                    "caption": round((captioned - decoded) * 1000, 1),
                    "render": 0.0,
                    "batch": len(ready),
                }
            except Exception as err:  # noqa: BLE001
                log.error("%s: the answer could not be made", job.filename, exc_info=err)
                _fail(job, InternalError())
                continue
            if job.want_gif or job.want_image:  # on the render thread: the model goes on with the next batch
                with self._cond:
                    full = self._rendering >= self.max_render
                    self._rendering += 0 if full else 1
                if full:
                    _fail(job, Busy(f"too many pictures being drawn ({self.max_render} requests); try again in a "
                                    "moment, or ask without return_gif / return_image"))
                    continue
                self._render.submit(self._finish, job, model, result, display, payload)
            else:
                job.future.set_result(payload)

    def _finish(self, job: Job, model: ServedModel, result: dict, display: Image.Image, payload: dict) -> None:
        self._mark("render", True)
        try:
            start = time.perf_counter()
            if job.want_gif:
                gif, payload["gif_info"] = model.gif(display, result, self.max_gif_pixels)
                if gif is not None:
                    payload["gif"] = data_uri(gif, "image/gif")
            if job.want_image:
                payload["image"] = encode_display(display)
            payload["timing_ms"]["render"] = round((time.perf_counter() - start) * 1000, 1)
            job.future.set_result(payload)
        except Exception as err:  # noqa: BLE001
            log.error("%s: drawing failed", job.filename, exc_info=err)
            _fail(job, InternalError("drawing the pictures failed"))
        finally:
            self._mark("render", False)
            with self._cond:
                self._rendering -= 1


def _fail(job: Job, err: Exception) -> None:
    """Answer ``job`` with ``err`` unless it has its answer already."""
    if not job.future.done():
        try:
            job.future.set_exception(err)
        except Exception:  # noqa: BLE001 - answered meanwhile (concurrent.futures.InvalidStateError)
            pass


def client_message(message: str, upload: str, filename: str) -> str:
    """An image error as the web client reads it: the client's file name for the server's temporary
    file, and the server's own option (--max-pixels) as the limit of a refused large image."""
    message = message.replace(upload, filename)
    return re.sub(r"\(possible decompression bomb;.*\)$",
                  "(possible decompression bomb; the server's limit, set by its --max-pixels option)", message)


def _image_error_status(message: str) -> int:
    """HTTP status of an unreadable upload: 415 not an image, 413 too many pixels, 400 otherwise."""
    if "not an image" in message or "not an accepted image format" in message:
        return 415
    if "decompression bomb" in message or "exceeds the limit" in message:
        return 413
    return 400
