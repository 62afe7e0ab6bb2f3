"""The one queue every request goes through: all the work of all the served models on one worker thread.

Nothing here knows about HTTP. :class:`InferenceQueue` is

* **bounded**: at most ``max_pending`` requests wait; one more is refused with :class:`Busy`
  (HTTP 503) instead of piling up. A waiting request holds only its upload, in a temporary file on
  disk; images are decoded by the worker, one batch at a time, and shrunk at once to what is
  needed (the model's S x S input and a display copy: :func:`captioning.web.images.prepare`; an
  ensemble whose members read different sizes or filters gets the decoded image itself).
* **batched**: the worker takes the oldest request and every other waiting request for the same
  model with the same settings (up to ``max_batch``) and captions them in one call, so that
  simultaneous requests share the beam search's matrix products. GIFs and display images are
  made on a second thread, so the model goes on with the next batch meanwhile; at most
  ``max_render`` requests wait for it (one more is refused with :class:`Busy`), and a GIF is
  drawn within a pixel budget (:mod:`captioning.web.gifs`).
* **isolated**: a request fails alone. An unreadable upload is its own 4xx; when the model fails
  on a batch, each of its requests is tried alone, so only the request that fails it gets a 500
  (a generic message; the detail goes to the server's log).
* **watched**: :meth:`InferenceQueue.health` tells how long the worker (and the drawing thread)
  have been on their current work, for ``/healthz`` to report a stuck worker.
"""

from __future__ import annotations

import collections
import logging
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from PIL import Image

from captioning.errors import ConfigError, ImageError
from captioning.web.errors import Busy, InternalError, RequestError, TooLarge, upload_error
from captioning.web.gifs import DEFAULT_GIF_PIXELS
from captioning.web.images import data_uri, encode_display, prepare
from captioning.web.served import ServedModel
from captioning.web.settings import Focus, Settings

DEFAULT_MAX_RENDER = 16  # requests waiting for their GIF / display image at most

log = logging.getLogger("captioning.web")


@dataclass
class Job:
    model: ServedModel
    settings: Settings
    upload: str  # a temporary file holding the uploaded bytes
    filename: str  # the client's name for it, for messages
    want_gif: bool = False
    want_image: bool = False
    focus: Focus | None = None  # a box in the upload's pixels (checked against its size once read)
    want_views: bool = False  # the answer carries the result's views (captioning/api.py: VIEW_SHAPES)
    future: Future = field(default_factory=Future)
    queued_at: float = field(default_factory=time.perf_counter)

    def shares_call(self, other: Job) -> bool:
        """Whether ``other`` can be captioned in this job's model call: the same model and settings,
        the same focus strength (each image has its own box, or none: focused and unfocused
        requests go in separate calls) and both asking for views or neither."""
        strength = None if self.focus is None else self.focus.strength
        return (
            other.model is self.model
            and other.settings == self.settings
            and strength == (None if other.focus is None else other.focus.strength)
            and other.want_views == self.want_views
        )


class InferenceQueue:
    """One worker thread, at most ``max_pending`` waiting requests, batches of up to ``max_batch``;
    one drawing thread, at most ``max_render`` requests waiting for it, GIFs within ``max_gif_pixels``."""

    def __init__(
        self,
        max_batch: int = 8,
        max_pending: int = 64,
        workdir: str | None = None,
        max_render: int = DEFAULT_MAX_RENDER,
        max_gif_pixels: int = DEFAULT_GIF_PIXELS,
    ):
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
        self._busy_since: dict[str, float | None] = {"worker": None, "render": None}
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
        return {
            "stuck": not alive or max(busy.values()) > stuck_after,
            "worker_alive": alive,
            "worker_busy_s": round(busy["worker"], 1),
            "render_busy_s": round(busy["render"], 1),
        }

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

    def _take(self) -> list[Job] | None:
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
                if len(batch) < self.max_batch and first.shares_call(job):
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

    def _prepare(self, job: Job, inputs: tuple[tuple[int, str], ...]) -> tuple | None:
        """(job, model input, display copy, (W, H)), or None with the job answered with its error
        (a focus box outside the image: a 400)."""
        try:
            prepared = (job, *prepare(job.upload, inputs))
            if job.focus is not None:
                from captioning.decoding.steering import check_box

                width, height = prepared[3]
                check_box(job.focus.box, width, height, "focus", image=job.filename)
            return prepared
        except ConfigError as err:
            _fail(job, RequestError(str(err)))
        except ImageError as err:
            _fail(job, upload_error(err, job.upload, job.filename))
        except MemoryError:
            _fail(job, TooLarge(f"{job.filename}: image too large to decode"))
        except Exception as err:  # noqa: BLE001 - one upload's failure is its own
            log.error("%s: reading the upload failed", job.filename, exc_info=err)
            _fail(job, InternalError("the server could not read this image"))
        return None

    def _caption(self, model: ServedModel, ready: list[tuple], settings: Settings) -> list[tuple]:
        """(job, result) of each request the model captions; when the batch fails, each request is
        tried alone, so that only the ones the model fails on get a 500."""
        focus = [None if job.focus is None else (job.focus, size) for job, _, _, size in ready]
        views = ready[0][0].want_views  # the same for the whole batch (Job.shares_call)
        try:
            return list(zip(ready, model.caption([inputs for _, inputs, _, _ in ready], settings, focus, views)))
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
        ready = [
            item
            for job in batch
            if job.future.set_running_or_notify_cancel()
            for item in [self._prepare(job, model.inputs)]
            if item is not None
        ]
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
                payload["focus"] = None if job.focus is None else job.focus.as_dict()
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
                    _fail(
                        job,
                        Busy(
                            f"too many pictures being drawn ({self.max_render} requests); try again in a "
                            "moment, or ask without return_gif / return_image"
                        ),
                    )
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
