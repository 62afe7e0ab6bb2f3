"""The web server against slow clients, strangers' hosts and files, and failures of one request.

Most tests run ``python -m captioning.web`` in a subprocess on 127.0.0.1 (tests/web/test_server.py's
ServerProcess) with short deadlines; those that need a model that fails, blocks or records its
calls serve a fake captioner with the same uvicorn configuration in a thread (a real server on a
socket). ``test_load`` (slow) runs tools/dev/web_load_test.py: 64 clients asking for GIFs of the
longest captions beside 50 stalled clients and 50 that never read their answers (a large example
image).
"""

from __future__ import annotations

import base64
import io
import json
import socket
import subprocess
import sys
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

from captioning.web.client import encode_multipart  # noqa: E402
from tests.helpers import FakeCaptioner, ServerProcess, _bomb_png, _connection, free_port, get_json, post_image  # noqa: E402

HEADER_TIMEOUT, BODY_TIMEOUT = 1.0, 1.5
SETTINGS = dict(num_beams=2, max_new_tokens=8)


def png_bytes(color=(200, 30, 30), size=(96, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    proc = ServerProcess(
        [tiny_checkpoint],
        "--header-timeout",
        HEADER_TIMEOUT,
        "--body-timeout",
        BODY_TIMEOUT,
        "--max-connections",
        8,
        "--max-pixels",
        4_000_000,
        "--max-gif-pixels",
        400_000,
        "--allowed-hosts",
        "captioning.test",
        log=tmp_path_factory.mktemp("hardening") / "server.log",
    )
    yield proc
    proc.stop()


def raw_socket(url: str) -> socket.socket:
    host, port = url.split("//")[1].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed ``sock`` within ``seconds``, what it sent before)."""
    sock.settimeout(0.2)
    got, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


# ---------------------------------------------------------------------- slow clients
def test_stalled_headers_are_closed_and_others_are_answered(server):
    port = server.url.rsplit(":", 1)[1]
    silent = [raw_socket(server.url) for _ in range(10)]
    partial = [raw_socket(server.url) for _ in range(10)]
    for sock in partial:
        sock.sendall(f"POST /api/caption HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Ty".encode())
    # 20 stalled sockets are more than --max-connections 8: idle sockets are not counted
    status, out = post_image(server.url, png_bytes(), **SETTINGS)
    assert status == 200 and out["generated_text"], out
    # closed at the header deadline; the bound leaves a busy machine time to run the server's timers
    results = [closed_within(sock, HEADER_TIMEOUT + 30) for sock in silent + partial]
    assert all(closed for closed, _ in results), f"{sum(not c for c, _ in results)} stalled sockets still open"
    # a kept-alive connection that starts a second request and stalls is closed too
    sock = raw_socket(server.url)
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    time.sleep(0.3)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
    closed, got = closed_within(sock, HEADER_TIMEOUT + 30)
    assert closed and got.startswith(b"HTTP/1.1 200")
    for s in silent + partial + [sock]:
        s.close()
    assert server.alive()


def test_a_stalled_body_gets_408_and_the_connection_closes(server):
    port = server.url.rsplit(":", 1)[1]
    body, content_type = encode_multipart(SETTINGS, "photo.png", png_bytes())
    socks = [raw_socket(server.url) for _ in range(5)]
    for sock in socks:
        sock.sendall(
            f"POST /api/caption HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:100]
        )
    # an oversized body that stalls while it is drained: the 413 comes at the deadline
    big = raw_socket(server.url)
    big.sendall(
        f"POST /api/caption HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {50 * 1024 * 1024}\r\n\r\n".encode()
        + b"x" * 1000
    )
    status, out = post_image(server.url, png_bytes(), **SETTINGS)
    assert status == 200, out
    for sock in socks:
        closed, got = closed_within(sock, BODY_TIMEOUT + 2)
        assert closed and got.startswith(b"HTTP/1.1 408"), got[:200]
        assert b"not sent within 1.5 s" in got
        sock.close()
    closed, got = closed_within(big, BODY_TIMEOUT + 2)
    assert closed and got.startswith(b"HTTP/1.1 413"), got[:200]
    big.close()
    assert server.alive()


SEND_TIMEOUT = 3.0
TCP_ESTABLISHED = 1  # tcp_info's first byte: the connection's state (linux/tcp_states.h)


def noise_png(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG of random pixels: it compresses badly, so that its GIF, and the file itself, are large."""
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def never_reads(url: str, request: bytes) -> socket.socket:
    """A client that sends ``request`` and never reads: a small receive window, so that the answer
    waits in the server's buffers."""
    host, port = url.split("//")[1].split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    sock.sendall(request)
    return sock


def answer_arrived(sock: socket.socket, seconds: float) -> bool:
    """Whether the first bytes of an answer arrived within ``seconds`` (peeked at: nothing is read)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return True
        except BlockingIOError:
            time.sleep(0.05)
    return False


def still_open(sock: socket.socket) -> bool:
    """Whether the connection is established: the server neither closed nor reset it (nothing is read)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_ESTABLISHED


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="reads the connection's state from TCP_INFO (Linux)")
def test_clients_that_never_read_are_reset_at_the_send_deadline(tiny_checkpoint, tmp_path):
    """Clients that send a request and never read its answer hold the server's memory and sockets
    (a GIF's answer) or a request slot (a streamed example image) only until --send-timeout: then
    their connections are reset and the server answers others."""
    example = tmp_path / "large.png"
    example.write_bytes(noise_png(2000, 1500))  # 9 MB: more than the sockets' buffers hold
    proc = ServerProcess(
        [tiny_checkpoint],
        "--examples",
        example,
        "--max-connections",
        2,
        "--max-sockets",
        8,
        "--send-timeout",
        SEND_TIMEOUT,
        "--max-gif-pixels",
        8_000_000,
        log=tmp_path / "server.log",
    )
    try:
        host = f"Host: 127.0.0.1:{proc.port}\r\n"
        body, content_type = encode_multipart(
            dict(num_beams=1, max_new_tokens=30, return_gif=1, return_image=1), "noise.png", noise_png(640, 480)
        )
        ask_gif = (
            f"POST /api/caption HTTP/1.1\r\n{host}Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        gifs = [never_reads(proc.url, ask_gif) for _ in range(3)]
        assert all(answer_arrived(sock, 60) for sock in gifs)
        examples = [never_reads(proc.url, f"GET /examples/0 HTTP/1.1\r\n{host}\r\n".encode()) for _ in range(2)]
        assert all(answer_arrived(sock, 60) for sock in examples)
        held = time.monotonic()
        # the two example answers are still being sent: both request slots are taken
        status, out = get_json(proc.url, "/api/models")
        assert status == 503 and "too many requests being handled" in out["error"], out
        assert all(still_open(sock) for sock in examples)
        end = held + SEND_TIMEOUT + 60
        while any(still_open(sock) for sock in gifs + examples):
            assert time.monotonic() < end, "connections that never read still open after the send deadline"
            time.sleep(0.1)
        assert time.monotonic() - held >= SEND_TIMEOUT - 0.5  # (the examples' deadline runs from their answer)
        # the slots are free again (/healthz itself the one request): a handler whose socket was closed
        # still unwinds (a GIF being rendered) for a moment after the client sees the close, longer on a
        # loaded machine, so /healthz is asked until then
        freed = time.monotonic() + 60
        while True:
            status, health = get_json(proc.url, "/healthz")
            if health.get("active") == 1 or time.monotonic() > freed:
                break
            time.sleep(0.2)
        assert status == 200 and health["active"] == 1, health
        status, out = post_image(proc.url, png_bytes(), **SETTINGS)
        assert status == 200 and out["generated_text"], out
        for sock in gifs + examples:
            sock.close()
        assert proc.alive()
    finally:
        proc.stop()


# ---------------------------------------------------------------------- hosts, messages, fields
def test_host_header_must_name_this_server(server):
    port = server.url.rsplit(":", 1)[1]
    for host, want in [
        ("evil.example.com", 400),
        (f"rebind.attacker.net:{port}", 400),
        (f"localhost:{port}", 200),
        (f"127.0.0.1:{port}", 200),
        ("captioning.test", 200),
        (f"[::1]:{port}", 200),
    ]:
        conn = _connection(server.url, 10)
        conn.putrequest("GET", "/api/models", skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        payload = json.loads(response.read())
        conn.close()
        assert response.status == want, (host, payload)
        if want == 400:
            assert "Host header not allowed" in payload["error"]


def test_a_large_image_names_the_servers_option_and_no_server_path(server):
    status, out = post_image(server.url, _bomb_png(), filename="bomb.png")
    assert status == 413, out
    message = out["error"]
    assert message.startswith("bomb.png: refused: 9,000,000 pixels exceeds the limit of 4,000,000 pixels")
    assert "--max-pixels" in message and "--max-image-pixels" not in message and "PIL" not in message, message


def test_models_show_the_training_data_by_file_name_only(server):
    status, info = get_json(server.url, "/api/models")
    data = info["models"][0]["description"]["training_data"]
    assert status == 200 and data == "dataset_shapes.json", data


def test_a_gif_is_shrunk_to_the_pixel_budget(server):
    # 12 words at most: 13 frames fit the budget shrunk (a caption of 30 or 100 words, which a barely
    # trained model can write, would not, and gets no GIF: the budget's other case)
    status, out = post_image(server.url, png_bytes(size=(640, 480)), num_beams=1, max_new_tokens=12, return_gif=1)
    assert status == 200, out
    assert "gif" in out, out.get("gif_info")
    gif = Image.open(io.BytesIO(base64.b64decode(out["gif"].split(",", 1)[1])))
    info = out["gif_info"]
    assert info["frames"] == gif.n_frames == len([t for t in out["tokens"] if t != "<end>"]) + 1
    assert [info["width"], info["height"]] == list(gif.size)
    assert gif.n_frames * gif.size[0] * gif.size[1] <= 400_000 == info["budget_pixels"]
    if gif.n_frames > 3:  # a 640 x 480 picture (400 x 300 shown) does not fit 400,000 pixels in 4 frames or more
        assert info["shrunk"]


# ---------------------------------------------------------------------- examples and the run's config
def test_examples_are_image_files_only(tiny_checkpoint, tmp_path):
    folder = tmp_path / "examples"
    folder.mkdir()
    (folder / "a.png").write_bytes(png_bytes())
    (folder / "notes.png").write_text("not a picture\n")
    (folder / "config.yaml").write_text("data: {}\n")
    outside = tmp_path / "secret.png"
    outside.write_bytes(png_bytes((0, 0, 255)))
    (folder / "b.png").symlink_to(outside)  # a link out of the folder
    proc = ServerProcess([tiny_checkpoint], "--examples", folder, log=tmp_path / "server.log")
    try:
        status, info = get_json(proc.url, "/api/models")
        assert status == 200 and [e["name"] for e in info["examples"]] == ["a.png"], info["examples"]
    finally:
        proc.stop()
    # a named file that is not an image: the server refuses to start, and says why
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "captioning.web",
            "--checkpoint",
            str(tiny_checkpoint),
            "--port",
            str(free_port()),
            "--examples",
            str(folder / "notes.png"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "--examples: not an image file" in run.stderr, run.stderr[-500:]


def test_the_run_config_is_read_only_beside_the_checkpoints_folder(tiny_checkpoint, tiny_shapes, tmp_path):
    from captioning.web.served import ServedModel

    config = f"data:\n  annotations: {tiny_shapes}\n  images_root: {tiny_shapes.parent}\nmodel:\n  secret: x\n"
    # a checkpoint kept in a folder whose parents hold somebody's config.yaml (e.g. /tmp): not read
    (tmp_path / "config.yaml").write_text(config)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "model.ckpt").write_bytes(Path(tiny_checkpoint).read_bytes())
    model = ServedModel.load(None, deep / "model.ckpt")
    assert model.examples == []
    # the layout Lightning writes: <run>/checkpoints/x.ckpt beside <run>/config.yaml
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    (run / "checkpoints" / "last.ckpt").write_bytes(Path(tiny_checkpoint).read_bytes())
    model = ServedModel.load(None, run / "checkpoints" / "last.ckpt")
    assert len(model.examples) == 8 and all(p.suffix == ".png" for p in model.examples)
    assert "secret" not in json.dumps(model.info())


# ---------------------------------------------------------------------- a fake model, served in a thread (conftest.py)
class GatedCaptioner(FakeCaptioner):
    """FakeCaptioner that waits for ``gate`` before each call, records the images' first pixel, and
    fails every call holding an all-black image (a request the model cannot caption)."""

    def __init__(self, max_new_tokens=20):
        super().__init__()
        from captioning.decoding.search import GenerationConfig

        self.generation = GenerationConfig(max_new_tokens=max_new_tokens)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, images, **kwargs):
        self.entered.set()
        self.gate.wait(30)
        if any(max(image.getextrema()[c][1] for c in range(3)) == 0 for image in images):
            raise RuntimeError("/secret/server/path: the model broke")
        out = super().__call__(images, **{k: v for k, v in kwargs.items() if k != "max_new_tokens"})
        self.calls[-1]["max_new_tokens"] = kwargs.get("max_new_tokens")
        return out


def _held_batch(fake, url, datas):
    """Send ``datas`` while the model is held on a first request, so that they are captioned as one batch."""
    fake.gate.clear()
    fake.entered.clear()
    with ThreadPoolExecutor(len(datas) + 1) as pool:
        first = pool.submit(post_image, url, png_bytes((10, 10, 10)))
        assert fake.entered.wait(10)
        futures = [pool.submit(post_image, url, data, filename=f"img{i}.png") for i, data in enumerate(datas)]
        end = time.monotonic() + 60  # all of them waiting in the queue (/healthz counts them), however busy
        while get_json(url, "/healthz")[1].get("pending") != len(datas):
            assert time.monotonic() < end, "the requests did not all reach the queue"
            time.sleep(0.05)
        fake.gate.set()
        return first.result(), [f.result() for f in futures]


def test_one_bad_request_fails_alone(served):
    fake = GatedCaptioner()
    server = served(fake, max_batch=8)
    datas = [png_bytes((50 * i, 100, 100)) for i in range(1, 4)] + [png_bytes((0, 0, 0))]
    first, answers = _held_batch(fake, server.url, datas)
    assert first[0] == 200
    assert [status for status, _ in answers] == [200, 200, 200, 500], answers
    message = answers[-1][1]["error"]
    assert message.startswith("internal error") and "/secret" not in message and "broke" not in message
    assert max(out["timing_ms"]["batch"] for _, out in answers[:3]) == 4  # they were batched with the bad one


def test_an_omitted_max_new_tokens_is_capped(served):
    fake = GatedCaptioner(max_new_tokens=1000)
    server = served(fake)
    status, out = post_image(server.url, png_bytes())
    assert status == 200 and fake.calls[-1]["max_new_tokens"] == 100, (out, fake.calls[-1])
    status, info = get_json(server.url, "/api/models")
    assert info["models"][0]["defaults"]["max_new_tokens"] == 100


def test_a_stuck_model_gives_503_and_an_unhealthy_healthz(served):
    from captioning.web.guard import Limits

    fake = GatedCaptioner()
    server = served(fake, limits=Limits(request_timeout=1.0, stuck_after=0.5))
    assert get_json(server.url, "/healthz")[0] == 200
    fake.gate.clear()
    try:
        conn = _connection(server.url, 20)
        body, content_type = encode_multipart({}, "a.png", png_bytes())
        conn.request("POST", "/api/caption", body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        out = json.loads(response.read())
        conn.close()
        assert response.status == 503 and response.getheader("Retry-After") == "1", out
        assert "did not answer within 1 s" in out["error"]
        status, health = get_json(server.url, "/healthz")
        assert status == 503 and health["status"] == "stuck" and health["worker_busy_s"] >= 0.5, health
    finally:
        fake.gate.set()
    end = time.monotonic() + 10
    while get_json(server.url, "/healthz")[0] != 200:
        assert time.monotonic() < end, "the worker did not recover"
        time.sleep(0.1)


def test_the_render_queue_is_bounded(served):
    from captioning.web.guard import Limits
    from captioning.web.served import ServedModel

    release = threading.Event()

    class SlowGif(ServedModel):
        def gif(self, image, result, max_pixels=0):
            release.wait(30)
            return b"GIF89a", {"frames": 1}

    fake = GatedCaptioner()
    server = served(fake, model_class=SlowGif, limits=Limits(max_render=2), max_batch=8)
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [
                pool.submit(post_image, server.url, png_bytes((20 * i, 50, 50)), return_gif=1) for i in range(1, 7)
            ]
            end = time.monotonic() + 60  # the four refused are answered while two are being drawn
            while sum(f.done() for f in futures) < 4:
                assert time.monotonic() < end, "the drawing queue refused fewer than four"
                time.sleep(0.05)
            release.set()
            answers = [f.result() for f in futures]
    finally:
        release.set()
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 200, 503, 503, 503, 503], statuses  # 2 handed to the drawing thread, the rest refused
    assert all("too many pictures being drawn" in out["error"] for status, out in answers if status == 503)


# ---------------------------------------------------------------------- load
@pytest.mark.slow
def test_load(tiny_checkpoint):
    """64 clients asking for GIFs of long captions (60 words at most), beside 50 stalled ones and 50
    that ask for a 9 MB example image and never read it: every good request answered with its GIF,
    every non-reading connection reset at the send deadline, the server's peak resident memory
    bounded, the server healthy after."""
    from tools.dev.web_load_test import run_load

    report = run_load(
        [str(tiny_checkpoint)],
        clients=64,
        requests=128,
        slow_clients=50,
        nonreading_clients=50,
        send_timeout=3.0,
        time_limit=45,
    )
    print("\n" + json.dumps(report, indent=1))
    assert report["answered"] == {"200": 128}, report["answered"]
    assert report["slow_clients_closed"] == report["slow_clients"] == 50
    assert report["nonreading_closed"] == report["nonreading_clients"] == 50, report
    assert report["healthy_after"]
    assert report["peak_rss_mb"] < 1500, report
