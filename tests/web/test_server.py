"""The web server (captioning.web) in a subprocess on 127.0.0.1, serving tiny models trained here.

An API round trip against the Captioner itself, every kind of bad upload answered with a 4xx while
the server keeps answering, and 32 simultaneous requests answered correctly with flat memory.
"""

from __future__ import annotations

import base64
import io
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")

from captioning.web.client import APIError, caption, encode_multipart  # noqa: E402
from tests.helpers import (  # noqa: E402
    MAX_PIXELS,
    MAX_UPLOAD_MB,
    SETTINGS,
    FakeCaptioner,
    ServerProcess,
    _bomb_png,
    _connection,
    get_json,
    jpeg_640x480,
    post,
    post_image,
)


@pytest.fixture(scope="module")
def test_images(tiny_shapes, tmp_path_factory) -> list[Path]:
    """8 test-split shapes images as 640 x 480 JPEG files."""
    folder = tmp_path_factory.mktemp("web_images")
    paths = []
    for i, src in enumerate(sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[:8]):
        path = folder / f"photo{i}.jpg"
        path.write_bytes(jpeg_640x480(src))
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def hard_checkpoint(tiny_shapes, tmp_path_factory) -> Path:
    """A hard-attention checkpoint after a few training steps on the tiny shapes data."""
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    cli = run_lightning_cli(
        fit_args(tiny_shapes, tmp_path_factory.mktemp("fit_hard"), config="shapes_hard.yaml", steps=3)
    )
    return Path(cli.trainer.checkpoint_callback.last_model_path)


@pytest.fixture(scope="module")
def server(tiny_checkpoint, hard_checkpoint, tmp_path_factory):
    proc = ServerProcess(
        [f"soft={tiny_checkpoint}", f"hard={hard_checkpoint}"],
        "--max-upload-mb",
        MAX_UPLOAD_MB,
        "--max-pixels",
        MAX_PIXELS,
        log=tmp_path_factory.mktemp("web_log") / "server.log",
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def captioners(tiny_checkpoint, hard_checkpoint):
    from captioning.api import Captioner

    return {
        "soft": Captioner.from_checkpoint(tiny_checkpoint, device="cpu"),
        "hard": Captioner.from_checkpoint(hard_checkpoint, device="cpu"),
    }


# ---------------------------------------------------------------------- the API
def test_models_and_page(server):
    status, info = get_json(server.url, "/api/models")
    assert status == 200
    models = {m["name"]: m for m in info["models"]}
    assert list(models) == ["soft", "hard"]
    for name, m in models.items():
        d = m["description"]
        assert d["attention"] == name and d["encoder"] == "small_cnn" and d["vocab_size"] > 4
        assert d["image_size"] == 64 and d["training_data"].endswith("dataset_shapes.json")
        assert "test_scores" in d and m["grid"] == [8, 8]
    assert (
        models["hard"]["attention_modes"] == ["expected", "argmax", "sample"]
        and models["soft"]["attention_modes"] == []
    )
    # the examples are the first test images of the training data, served by index
    assert len(info["examples"]) == 8
    conn = _connection(server.url, 10)
    conn.request("GET", info["examples"][0]["url"])
    response = conn.getresponse()
    assert response.status == 200 and response.read().startswith(b"\x89PNG")
    conn.request("GET", "/examples/99")
    response = conn.getresponse()
    assert response.status == 404 and "error" in json.loads(response.read())
    conn.request("GET", "/")
    response = conn.getresponse()
    page = response.read().decode()
    assert response.status == 200 and "<title>Show, Attend and Tell" in page and 'id="file-input"' in page
    conn.close()


@pytest.mark.parametrize("name", ["soft", "hard"])
def test_api_round_trip_equals_the_captioner(server, captioners, test_images, name):
    extra = {"attention_mode": "argmax"} if name == "hard" else {}
    out = caption(test_images[0], url=server.url, model=name, return_gif=True, return_image=True, **SETTINGS, **extra)
    [want] = captioners[name]([str(test_images[0])], return_attention=True, **SETTINGS, **extra)
    assert out["model"] == name and out["attention_kind"] == name
    assert out["generated_text"] == want["generated_text"] and out["tokens"] == want["tokens"]
    assert out["score"] == pytest.approx(want["score"], abs=1e-4)
    attention = np.array(out["attention"])
    assert attention.shape == want["attention"].shape == tuple(out["attention_shape"])
    np.testing.assert_allclose(attention, want["attention"], atol=1e-4)
    assert [tuple(c) for c in out["locations"]] == [tuple(c) for c in want["locations"]]
    assert out["beams"][0] == {
        "generated_text": want["generated_text"],
        "score": pytest.approx(want["score"], abs=1e-4),
    }
    assert out["settings"]["num_beams"] == 2 and out["settings"]["attention_mode"] == extra.get("attention_mode")
    assert out["image_size"] == [640, 480]
    # the GIF: a frame per word (the end token has none) and one with the whole caption
    gif = Image.open(io.BytesIO(base64.b64decode(out["gif"].split(",", 1)[1])))
    words = [t for t in out["tokens"] if t != "<end>"]
    assert gif.format == "GIF" and gif.n_frames == len(words) + 1
    image = Image.open(io.BytesIO(base64.b64decode(out["image"].split(",", 1)[1])))
    assert image.size == (400, 300)  # the display copy: longest side 400
    assert set(out["timing_ms"]) >= {"queue", "decode", "caption", "render", "batch"}


def test_defaults_need_no_fields_and_a_soft_model_ignores_the_attention_mode(server, captioners, test_images):
    status, out = post_image(server.url, test_images[1].read_bytes(), attention_mode="sample")
    [want] = captioners["soft"]([str(test_images[1])], num_beams=3)
    assert status == 200 and out["model"] == "soft" and out["generated_text"] == want["generated_text"]
    from captioning.web.settings import form_options

    assert out["settings"] == {**dict.fromkeys(form_options()), "num_beams": 3, "num_beam_groups": 1}
    assert "gif" not in out and "image" not in out


def test_python_client_reports_errors(server):
    with pytest.raises(APIError) as info:
        caption(b"hello", url=server.url, filename="notes.txt")
    assert info.value.status == 415 and "notes.txt: not an image file" in info.value.message


# ---------------------------------------------------------------------- strangers' files
def _truncated_jpeg(test_images) -> bytes:
    data = test_images[0].read_bytes()
    return data[: len(data) // 2]


BAD = {
    "not an image": (lambda imgs: b"this is not a picture\n" * 20, "doc.jpg", 415, "doc.jpg: not an image file"),
    "pdf": (
        lambda imgs: b"%PDF-1.4 this is not a picture\n" * 20,
        "doc.jpg",
        415,
        "doc.jpg: refused: PDF is not an accepted image format",
    ),
    "html page": (lambda imgs: b"<!DOCTYPE html><html><body>404</body></html>", "page.png", 415, "HTML/XML text"),
    "empty": (lambda imgs: b"", "empty.jpg", 400, "empty.jpg: empty file (0 bytes)"),
    "truncated": (_truncated_jpeg, "cut.jpg", 400, "cut.jpg: unreadable image, damaged or truncated"),
    "oversized": (
        lambda imgs: os.urandom(MAX_UPLOAD_MB * 1024 * 1024 + 1),
        "huge.jpg",
        413,
        "upload too large: the limit is 1 MB",
    ),
    "far oversized": (lambda imgs: os.urandom(5 * MAX_UPLOAD_MB * 1024 * 1024), "huge.png", 413, "the limit is 1 MB"),
    "decompression bomb": (lambda imgs: _bomb_png(), "bomb.png", 413, "exceeds the limit of 4,000,000 pixels"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_uploads_get_a_4xx_and_the_server_stays_up(server, test_images, case):
    make, filename, status, message = BAD[case]
    got, out = post_image(server.url, make(test_images), filename=filename)
    assert got == status and message in out["error"] and "\n" not in out["error"], out
    assert "/tmp" not in out["error"]  # the server's temporary file is never named
    assert server.alive()
    good, answer = post_image(server.url, test_images[0].read_bytes(), **SETTINGS)
    assert good == 200 and answer["generated_text"]


def test_bad_requests_get_a_4xx(server, test_images):
    data = test_images[0].read_bytes()
    cases = [
        (post_image(server.url, data, num_beams="many"), 400, "num_beams: expected an integer"),
        (post_image(server.url, data, num_beams=50), 400, "num_beams: expected an integer in [1, 10], got 50"),
        (post_image(server.url, data, length_penalty="nan"), 400, "length_penalty"),
        (post_image(server.url, data, attention_mode="peek"), 400, "attention_mode: expected one of"),
        (post_image(server.url, data, model="nope"), 404, "unknown model 'nope'; served: soft, hard"),
        (post(server.url, b"{}", {"Content-Type": "application/json"}), 415, "multipart/form-data"),
        (post(server.url, b"--x\r\n", {"Content-Type": "multipart/form-data; boundary=x"}), 400, "no image"),
    ]
    body, content_type = encode_multipart({}, "a.jpg", data)
    cases.append(
        (
            post(server.url, body.replace(b'name="image"', b'name="picture"'), {"Content-Type": content_type}),
            400,
            "field 'image'",
        )
    )
    # a body sent in chunks, without Content-Length, is counted as it arrives
    big, content_type = encode_multipart({}, "big.jpg", os.urandom(2 * MAX_UPLOAD_MB * 1024 * 1024))
    chunks = (big[i : i + 65536] for i in range(0, len(big), 65536))
    cases.append(
        (
            post(
                server.url, chunks, {"Content-Type": content_type, "Transfer-Encoding": "chunked"}, encode_chunked=True
            ),
            413,
            "upload too large",
        )
    )
    for (status, out), want_status, message in cases:
        assert status == want_status and message in out.get("error", ""), (status, out, message)
    conn = _connection(server.url, 10)
    conn.request("GET", "/api/caption")
    response = conn.getresponse()
    assert response.status == 405 and "method not allowed" in json.loads(response.read())["error"]
    conn.close()
    assert server.alive()


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **kw)
    return buffer.getvalue()


def test_any_image_mode_and_exif_orientation(server, test_images):
    base = Image.open(test_images[0]).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown rotated 90 degrees: portrait
    rgba = base.convert("RGBA")
    rgba.putalpha(128)
    uploads = {
        "rotated.jpg": (_save(base, "JPEG", exif=exif.tobytes()), [480, 640]),
        "grey16.png": (_save(Image.fromarray(np.asarray(base.convert("L"), dtype=np.uint16) * 257), "PNG"), [640, 480]),
        "alpha.png": (_save(rgba, "PNG"), [640, 480]),
        "cmyk.jpg": (_save(base.convert("CMYK"), "JPEG"), [640, 480]),
        "palette.gif": (_save(base.convert("P"), "GIF"), [640, 480]),
        "bw.bmp": (_save(base.convert("1"), "BMP"), [640, 480]),
        "photo.webp": (_save(base, "WEBP"), [640, 480]),
    }
    for name, (data, size) in uploads.items():
        status, out = post_image(server.url, data, filename=name, **SETTINGS)
        assert status == 200 and out["image_size"] == size and out["generated_text"], (name, out)


# ---------------------------------------------------------------------- load
def test_32_concurrent_requests_are_answered_correctly_with_flat_memory(server, captioners, test_images):
    images = [p.read_bytes() for p in test_images]
    want = [r["generated_text"] for r in captioners["soft"]([str(p) for p in test_images], **SETTINGS)]

    def one(i):
        return post_image(server.url, images[i % len(images)], filename=f"photo{i}.jpg", **SETTINGS)

    with ThreadPoolExecutor(8) as pool:  # warm-up: the first batches of each size allocate what later ones reuse
        assert all(status == 200 for status, _ in pool.map(one, range(16)))
    before = server.rss_mb()
    peak, stop = [before], threading.Event()

    def watch():
        while not stop.is_set():
            peak.append(server.rss_mb())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(one, range(32)))
    finally:
        stop.set()
        watcher.join()
    seconds = time.perf_counter() - start
    after = server.rss_mb()
    assert [status for status, _ in answers] == [200] * 32, [a for a in answers if a[0] != 200][:2]
    assert [out["generated_text"] for _, out in answers] == [want[i % len(want)] for i in range(32)]
    growth = max(peak) - before
    print(
        f"\n32 concurrent requests in {seconds:.2f} s ({32 / seconds:.1f} req/s); RSS {before:.0f} MB before, "
        f"peak {max(peak):.0f} MB, after {after:.0f} MB (growth {growth:.0f} MB); "
        f"largest batch {max(out['timing_ms']['batch'] for _, out in answers)}"
    )
    assert growth < 200, f"resident memory grew by {growth:.0f} MB under 32 concurrent requests"
    assert max(out["timing_ms"]["batch"] for _, out in answers) > 1  # simultaneous requests were batched
    assert server.alive()


def test_a_full_queue_answers_503(tiny_checkpoint, test_images, tmp_path):
    """With room for 1 waiting request, a burst of 32 gets some 503s (Retry-After), never a crash."""
    proc = ServerProcess([tiny_checkpoint], "--max-pending", 1, "--max-batch", 1, log=tmp_path / "server.log")
    try:
        data = test_images[0].read_bytes()
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda i: post_image(proc.url, data, return_gif=1), range(32)))
        statuses = [status for status, _ in answers]
        assert set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses, statuses
        assert all("too many requests waiting" in out["error"] for status, out in answers if status == 503)
        assert proc.alive()
    finally:
        proc.stop()


# ---------------------------------------------------------------------- pieces, without a server
def test_served_model_uses_describe_and_top_beams():
    from captioning.web.served import ServedModel
    from captioning.web.settings import Settings

    fake = FakeCaptioner()
    model = ServedModel("hard", fake)
    assert model.hard and model.info()["returns_beams"]
    assert model.description["test_scores"] == {"BLEU-4": pytest.approx(0.25), "CIDEr": 0.9}
    assert model.description["training_data"] == "coco (Karpathy train)" and model.description["encoder"] == "resnet101"
    json.dumps(model.info())  # plain JSON types only
    [result] = model.caption(
        [Image.new("RGB", (32, 32))], Settings.parse({"num_beams": "4", "attention_mode": "argmax"}, hard=True)
    )
    assert fake.calls[-1] == dict(n=1, num_beams=4, attention_mode="argmax", num_return_sequences=4)
    out = model.to_json(result)
    assert out["beams"] == [{"generated_text": "a cat", "score": -0.5}, {"generated_text": "a a cat", "score": -0.9}]
    assert out["locations"] == [[0, 1], [1, 1], [0, 0]] and out["attention_shape"] == [3, 2, 2] and model.grid == (2, 2)


def test_settings_are_checked():
    from captioning.web.errors import RequestError
    from captioning.web.served import ServedModel
    from captioning.web.settings import Settings

    assert Settings.parse({}, hard=False) == Settings(num_beams=3)
    assert Settings.parse({}, hard=False).as_dict()["max_new_tokens"] is None  # the model's own
    got = Settings.parse(
        {
            "num_beams": " 5 ",
            "max_new_tokens": "20",
            "length_penalty": "0.7",
            "attention_mode": "argmax",
            "num_return_sequences": "2",
        },
        hard=True,
    )
    assert got == Settings(
        num_beams=5, max_new_tokens=20, length_penalty=0.7, attention_mode="argmax", num_return_sequences=2
    )
    assert Settings.parse({"attention_mode": "argmax"}, hard=False).attention_mode is None
    # each field alone: its option's type and bounds, within the server's caps
    for fields, message in [
        ({"num_beams": "0"}, r"num_beams: expected an integer in \[1, 10\], got 0"),
        ({"num_beams": "11"}, r"num_beams: expected an integer in \[1, 10\], got 11"),
        ({"max_new_tokens": "1.5"}, "max_new_tokens: expected an integer"),
        ({"max_new_tokens": "101"}, r"max_new_tokens: expected an integer in \[1, 100\]"),
        ({"length_penalty": "inf"}, "length_penalty: expected a finite number"),
        ({"length_penalty": "6"}, r"length_penalty: expected a finite number in \[-5, 5\]"),
        ({"diversity_penalty": "11"}, r"diversity_penalty: expected a finite number in \[0, 10\]"),
        ({"attention_mode": "peek"}, "attention_mode: expected one of expected, argmax, sample"),
        (
            {"num_beams": "2", "num_return_sequences": "3"},
            r"num_return_sequences: expected an integer in \[1, 2\], got 3",
        ),
        ({"num_beams": "4", "num_beam_groups": "5"}, r"num_beam_groups: expected an integer in \[1, 4\]"),
    ]:
        with pytest.raises(RequestError, match=message):
            Settings.parse(fields, hard=True)
    diverse = Settings.parse({"num_beams": "4", "num_beam_groups": "2"}, hard=False)
    assert (diverse.num_beam_groups, diverse.diversity_penalty) == (2, 0.5)
    # the fields together: checked by GenerationConfig over the model's own settings
    model = ServedModel("hard", FakeCaptioner())
    assert model.settings({"num_beams": "4", "num_beam_groups": "2"}) == diverse
    for fields, message in [
        ({"num_beams": "4", "num_beam_groups": "3"}, r"num_beam_groups \(3\) must divide num_beams \(4\)"),
        ({"diversity_penalty": "1.0"}, "diversity_penalty applies between beam groups"),
        ({"num_beams": "4", "num_beam_groups": "2", "diversity_penalty": "0"}, "needs diversity_penalty > 0"),
        ({"do_sample": "true"}, "do_sample works with one beam"),
        ({"min_new_tokens": "40", "max_new_tokens": "20"}, r"min_new_tokens \(40\) must be below"),
    ]:
        with pytest.raises(RequestError, match=message):
            model.settings(fields)


def test_diverse_beams_are_listed_side_by_side(server, captioners, test_images):
    status, out = post_image(
        server.url, test_images[2].read_bytes(), num_beams=4, num_beam_groups=2, diversity_penalty=1.5
    )
    want = captioners["soft"](
        [str(test_images[2])], num_beams=4, num_beam_groups=2, diversity_penalty=1.5, num_return_sequences=4
    )[0]
    assert status == 200 and len(out["beams"]) == 4
    assert [b["generated_text"] for b in out["beams"]] == [b["generated_text"] for b in want["beams"]]


def test_names_specs_and_the_serve_subcommand():

    from captioning.cli.main import build_parser
    from captioning.cli.serve import Serve
    from captioning.web import serve_command
    from captioning.web.server import _name_models, split_spec

    assert split_spec("soft=runs/a.ckpt") == ("soft", "runs/a.ckpt") and split_spec("runs/a.ckpt") == (
        None,
        "runs/a.ckpt",
    )

    class M:
        def __init__(self, attention, encoder):
            self.description, self.name = {"attention": attention, "encoder": encoder}, None

    models = [M("soft", "resnet101"), M("hard", "resnet101"), M("soft", "vgg16"), M("soft", "vgg16")]
    _name_models(models, [None, None, None, "mine"])
    assert [m.name for m in models] == ["soft-resnet101", "hard", "soft-vgg16", "mine"]
    models = [M("soft", "x"), M("soft", "x")]
    _name_models(models, [None, None])
    assert [m.name for m in models] == ["soft-x", "soft-x-2"]

    args = build_parser().parse_args(["serve", "--checkpoint", "a.ckpt", "--checkpoint", "hard=b.ckpt"])
    assert args.run.__func__ is Serve.run and args.checkpoint == ["a.ckpt", "hard=b.ckpt"]
    assert (args.host, args.port, args.max_upload_mb) == ("127.0.0.1", 7860, 10.0)
    assert serve_command("runs/best.ckpt") == "captioning serve --checkpoint runs/best.ckpt"


def test_an_ensemble_is_served_as_one_model(tiny_checkpoint, hard_checkpoint, tiny_shapes):
    """``--checkpoint NAME=A+B``: one model on the page, the ensemble's captions."""
    from PIL import Image

    from captioning.api import Captioner
    from captioning.web.served import ServedModel, ensemble_members
    from captioning.web.settings import Settings

    assert ensemble_members(f"{tiny_checkpoint}+{hard_checkpoint}") == [str(tiny_checkpoint), str(hard_checkpoint)]
    assert ensemble_members(str(tiny_checkpoint)) == [str(tiny_checkpoint)]
    served = ServedModel.load("both", f"{tiny_checkpoint}+{hard_checkpoint}")
    assert served.checkpoint == Path(tiny_checkpoint)
    assert [m["checkpoint"] for m in served.description["ensemble"]] == [
        Path(tiny_checkpoint).name,
        Path(hard_checkpoint).name,
    ]
    image = Image.open(next(Path(tiny_shapes).parent.rglob("*.png"))).convert("RGB")
    settings = Settings()
    [ours] = served.caption([image], settings)
    # the same search as the page's (the API's own default is one beam)
    [theirs] = Captioner.from_checkpoints([tiny_checkpoint, hard_checkpoint], device="cpu")(
        image, num_beams=settings.num_beams, max_new_tokens=served.max_new_tokens(settings)
    )
    assert ours["generated_text"] == theirs["generated_text"]


def test_the_server_captions_an_ensemble_as_the_captioner_does(tiny_checkpoint, tiny_shapes, tmp_path):
    """An ensemble of members that read images at different sizes and with different filters: the
    server hands each member the upload resized once, from the original, as ``captioning caption``
    does, so its caption, score and maps are the Captioner's on the same file."""
    import torch

    from captioning.api import Captioner
    from captioning.data.images import load_image

    # a second member: the same weights reading 48 px images resized with the bicubic filter
    ckpt = torch.load(tiny_checkpoint, map_location="cpu", weights_only=True)
    ckpt["hyper_parameters"]["image_size"] = 48
    ckpt["preprocessing"] = {**ckpt.get("preprocessing", {}), "interpolation": "bicubic"}
    other = tmp_path / "bicubic48.ckpt"
    torch.save(ckpt, other)
    members = [str(tiny_checkpoint), str(other)]
    upload = tmp_path / "photo.jpg"
    upload.write_bytes(jpeg_640x480(next(Path(tiny_shapes).parent.rglob("*.png"))))
    proc = ServerProcess([f"both={'+'.join(members)}"], log=tmp_path / "server.log")
    try:
        status, out = post_image(proc.url, upload.read_bytes(), filename="photo.jpg", **SETTINGS)
    finally:
        proc.stop()
    assert status == 200, out
    [theirs] = Captioner.from_checkpoints(members, device="cpu")(
        [load_image(upload)], return_attention=True, num_return_sequences=SETTINGS["num_beams"], **SETTINGS
    )
    assert (out["generated_text"], out["tokens"]) == (theirs["generated_text"], theirs["tokens"])
    assert out["score"] == theirs["score"]  # bit for bit: the same pixels went in
    assert out["attention"] == np.round(theirs["attention"].astype(np.float64), 4).tolist()
