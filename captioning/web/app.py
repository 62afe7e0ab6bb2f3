"""The web app: the page, ``POST /api/caption`` and friends, as one Starlette application.

Routes:

    GET  /                    the page (captioning/web/page.py), in ``?lang=``'s language, else ``lang``'s,
                              else the Accept-Language header's (English or Chinese)
    GET  /api/models          the served models: name, description, default settings
    POST /api/caption         multipart form: ``image`` (the file), optional ``model``, ``return_gif``,
                              ``return_image``, the settings (web/settings.py) -> JSON (docs/WEB.md)
    GET  /atlas               the atlas page: every served model on one image and one word
    POST /api/atlas           multipart form: ``image``, optional ``word`` and ``example`` (the index of
                              the example image sent, for its objects) -> the panels and the atlas PNG
    GET  /examples/{i}        the i-th example image offered on the page
    GET  /healthz             {"status": "ok", "pending": n, ...}; 503 {"status": "stuck", ...} when
                              the worker has been on one batch longer than ``Limits.stuck_after``

Every error is JSON ``{"error": "one line"}`` with the status of its type (captioning/web/errors.py;
docs/WEB.md, "Errors", lists them). The middlewares around it, outermost first:
:class:`~captioning.web.guard.Guard` (Host header, requests handled, body deadline) and
:class:`~captioning.web.guard.LimitBody` (the upload limit), in captioning/web/guard.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from captioning.web.errors import (
    MB,
    Busy,
    InternalError,
    MethodNotAllowed,
    NotFound,
    RequestError,
    UnsupportedMedia,
    UploadTooLarge,
)
from captioning.web.examples import EXAMPLES
from captioning.web.guard import Guard, LimitBody, Limits, allowed_host_names
from captioning.web.served import ServedModel
from captioning.web.service import InferenceQueue, Job, log
from captioning.web.settings import FOCUS_FIELDS, form_description, form_options, parse_focus, truthy

CHUNK = 256 * 1024
# the form's fields besides the decoding settings
FORM_FIELDS = ("image", "model", "return_gif", "return_image", "return_views", *FOCUS_FIELDS)
#: the atlas form's fields (POST /api/atlas)
ATLAS_FIELDS = ("image", "word", "example")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _safe_name(name: str | None) -> str:
    """The client's file name, reduced to something harmless to echo in a message."""
    name = os.path.basename(name or "") or "upload"
    return re.sub(r"[^\w.\- ]", "_", name)[:80] or "upload"


def example_objects(path: Path):
    """The shapes objects of an example image (viz/atlas.py: the ``dataset_shapes.json`` above it), or None."""
    from captioning.viz.atlas import image_objects

    try:
        return image_objects(path)[0]
    except Exception as err:  # noqa: BLE001 - object F1 is a convenience: an unreadable dataset has none
        log.warning("%s: no objects for object F1 (%s)", path.name, err)
        return None


def atlas_answer(models: Sequence[ServedModel], payloads: Sequence[dict], word: str | None, objects) -> dict:
    """``POST /api/atlas``'s answer from each model's caption answer: the word, a note, the panels
    (viz/atlas.py: Panel.as_json) and the atlas drawn as ``captioning atlas`` draws it (a PNG data URI)."""
    import base64
    import io

    from PIL import Image

    from captioning.viz.atlas import atlas_panels, render_atlas
    from captioning.web.images import data_uri

    described = []
    for model, payload in zip(models, payloads):
        decoder = getattr(getattr(model.captioner, "spec", None), "decoder", None)
        described.append((model.name, decoder, payload, payload["attention_kind"] == "hard"))
    panels, chosen, note = atlas_panels(described, word, objects)
    display = Image.open(io.BytesIO(base64.b64decode(payloads[0]["image"].split(",", 1)[1]))).convert("RGB")
    picture = render_atlas(display, panels, chosen, note, cols=min(4, len(panels)), size=200)
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return {
        "word": chosen,
        "note": note,
        "panels": [p.as_json() for p in panels],
        "atlas": data_uri(buffer.getvalue(), "image/png"),
    }


def create_app(
    models: Sequence[ServedModel],
    max_upload_bytes: int = 10 * MB,
    max_batch: int = 8,
    max_pending: int = 64,
    workdir: str | None = None,
    limits: Limits = Limits(),
    host: str = "127.0.0.1",
    lang: str | None = None,
):
    """The ASGI application serving ``models`` (the first is the default of the API), bound to
    ``host`` (for the Host header check: see :func:`allowed_host_names`); ``lang``: the page's language
    (a key of ``web.page.LANGUAGES``; None: the browser's, from its Accept-Language header)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, HTMLResponse, JSONResponse
    from starlette.routing import Route

    from captioning.web.page import LANGUAGES, atlas_page, choose_language, page

    if not models:
        raise ValueError("at least one model to serve")
    if lang is not None and lang not in LANGUAGES:
        raise ValueError(f"the page's language: expected one of {', '.join(LANGUAGES)}, got {lang!r}")
    by_name = {m.name: m for m in models}
    if len(by_name) != len(models):
        raise ValueError(f"model names must differ: {[m.name for m in models]}")
    examples: list[Path] = []
    for model in models:
        examples += [p for p in model.examples if p not in examples]
    examples = examples[:EXAMPLES]
    owns_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="captioning-web-")
    state: dict = {}

    def error(err: RequestError) -> JSONResponse:
        return JSONResponse({"error": str(err)}, status_code=err.status, headers=dict(err.headers) or None)

    async def show_page(request: Request):
        language = choose_language(request.query_params.get("lang"), lang, request.headers.get("accept-language"))
        return HTMLResponse(page(language), headers=language_headers(language))

    async def health(request: Request):
        queue = state.get("queue")
        if queue is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        watch = queue.health(limits.stuck_after)
        payload = {
            "status": "stuck" if watch.pop("stuck") else "ok",
            "models": list(by_name),
            "pending": queue.pending(),
            "rendering": queue.rendering(),
            "active": guard.active,
            "batches": queue.batches,
            "largest_batch": queue.largest_batch,
            **watch,
        }
        return JSONResponse(payload, status_code=503 if payload["status"] != "ok" else 200)

    async def list_models(request: Request):
        return JSONResponse(
            {
                "models": [m.info() for m in models],
                "examples": [{"url": f"/examples/{i}", "name": p.name} for i, p in enumerate(examples)],
                "max_upload_bytes": max_upload_bytes,
                "max_gif_pixels": limits.max_gif_pixels,
                "options": form_description(),
            }
        )

    async def example(request: Request):
        i = request.path_params["index"]
        if not 0 <= i < len(examples):
            return error(NotFound(f"no example {i}"))
        return FileResponse(examples[i])

    async def read_form(request: Request, fields: int | None = None) -> tuple[str, str, dict[str, str]]:
        """(the upload's temporary file, the client's name for it, the other fields) of a caption request
        (``fields``: the most fields the form may have; a caption request's by default)."""
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise UnsupportedMedia(
                "send a multipart/form-data body with the image in the field 'image' (curl -F image=@photo.jpg)"
            )
        try:
            form = await request.form(max_files=1, max_fields=fields or len(FORM_FIELDS) + len(form_options()))
        except RequestError:  # the middlewares' BodyTimeout and UploadTooLarge, raised while the body is read
            raise
        except Exception as err:  # noqa: BLE001 - a malformed multipart body
            detail = getattr(err, "detail", None) or str(err) or type(err).__name__
            raise RequestError(f"could not read the form: {detail}") from None
        try:
            upload = form.get("image")
            if upload is None or isinstance(upload, str):
                raise RequestError("no image: send the image file as the multipart form field 'image'")
            name = _safe_name(upload.filename)
            fd, path = tempfile.mkstemp(suffix=".upload", dir=workdir)
            size = 0
            try:
                with os.fdopen(fd, "wb") as out:
                    while chunk := await upload.read(CHUNK):
                        size += len(chunk)
                        if size > max_upload_bytes:
                            raise UploadTooLarge(max_upload_bytes)
                        out.write(chunk)
                if size == 0:
                    raise RequestError(f"{name}: empty file (0 bytes)")
            except BaseException:
                _unlink(path)
                raise
            return path, name, {k: v for k, v in form.items() if isinstance(v, str)}
        finally:
            await form.close()

    def form_route(fields: int | None = None):
        """A POST route reading a multipart form (``read_form``): the handler gets (upload, name,
        fields); a RequestError answers its 4xx, any other failure is logged and answers a generic
        500, and the upload is deleted either way."""

        def wrap(handler):
            async def route(request: Request):
                upload = None
                try:
                    upload, name, form = await read_form(request, fields)
                    return await handler(upload, name, form)
                except RequestError as err:
                    return error(err)
                except Exception as err:  # noqa: BLE001 - a failure of the server: logged, a generic answer
                    log.error("%s %s failed", request.method, request.url.path, exc_info=err)
                    return error(InternalError("the server failed on this request"))
                finally:
                    if upload is not None:
                        _unlink(upload)

            route.__doc__ = handler.__doc__
            return route

        return wrap

    async def answers(futures: list, what: str) -> list:
        """The queue's answers to ``futures``, or Busy after the request timeout (the futures cancelled:
        a waiting job is skipped by the worker, a running one is dropped)."""
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), limits.request_timeout
            )
        except asyncio.TimeoutError:
            for future in futures:
                future.cancel()
            raise Busy(f"{what} did not answer within {limits.request_timeout:g} s; try again in a moment") from None

    @form_route()
    async def caption(upload: str, name: str, fields: dict):
        model_name = fields.get("model") or models[0].name
        model = by_name.get(model_name)
        if model is None:
            raise NotFound(f"unknown model {model_name[:60]!r}; served: {', '.join(by_name)}")
        settings = model.settings(fields)
        focus = parse_focus(fields)
        if focus is not None and model.focus_problem:
            raise RequestError(f"{model.focus_problem} (model {model.name!r})")
        job = Job(
            model,
            settings,
            upload,
            name,
            want_gif=truthy(fields.get("return_gif")),
            want_image=truthy(fields.get("return_image")),
            focus=focus,
            want_views=truthy(fields.get("return_views")),
        )
        (payload,) = await answers([state["queue"].submit(job)], "the model")
        return JSONResponse(payload)

    def language_headers(language: str) -> dict:
        headers = {"Content-Language": LANGUAGES[language][0]}
        if lang is None:  # the answer depends on the header: caches keep one per language
            headers["Vary"] = "Accept-Language"
        return headers

    async def show_atlas(request: Request):
        language = choose_language(request.query_params.get("lang"), lang, request.headers.get("accept-language"))
        return HTMLResponse(atlas_page(language), headers=language_headers(language))

    @form_route(len(ATLAS_FIELDS))
    async def atlas(upload: str, name: str, fields: dict):
        """Every served model captions the upload (through the queue, as /api/caption), then the
        panels of viz/atlas.py: the chosen word's map, the mechanism's equation, object F1 when the
        upload is an example whose objects are known."""
        objects = None
        if fields.get("example", "").strip():
            try:
                index = int(fields["example"])
            except ValueError:
                raise RequestError(f"example: expected an example's index, got {fields['example'][:20]!r}") from None
            if not 0 <= index < len(examples):
                raise NotFound(f"no example {index}")
            objects = await asyncio.to_thread(example_objects, examples[index])
        jobs = [Job(model, model.settings({}), upload, name, want_image=k == 0) for k, model in enumerate(models)]
        futures = []
        try:
            for job in jobs:  # a full queue refuses one: the others are cancelled
                futures.append(state["queue"].submit(job))
        except Busy:
            for future in futures:
                future.cancel()
            raise
        payloads = await answers(futures, "the models")
        word = (fields.get("word") or "").strip() or None
        answer = await asyncio.to_thread(atlas_answer, models, payloads, word, objects)
        return JSONResponse(answer)

    async def not_found(request: Request, exc):
        if getattr(exc, "status_code", 404) == 405:
            return error(MethodNotAllowed(f"{request.method} {request.url.path}: method not allowed"))
        return error(NotFound(f"{request.method} {request.url.path}: not found"))

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        state["queue"] = InferenceQueue(
            max_batch=max_batch,
            max_pending=max_pending,
            workdir=workdir,
            max_render=limits.max_render,
            max_gif_pixels=limits.max_gif_pixels,
        )
        try:
            yield
        finally:
            state["queue"].close()
            if owns_workdir:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)

    routes = [
        Route("/", show_page),
        Route("/healthz", health),
        Route("/api/models", list_models),
        Route("/api/caption", caption, methods=["POST"]),
        Route("/examples/{index:int}", example),
        Route("/atlas", show_atlas),
        Route("/api/atlas", atlas, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    # room for the form's other fields and boundaries; the file itself is held to max_upload_bytes above
    limited = LimitBody(app, max_upload_bytes + 64 * 1024, upload_limit=max_upload_bytes)
    guard = Guard(limited, limits, allowed_host_names(host, limits.allowed_hosts))
    return guard
