"""A served model folder whose tokenizer file brings a pipeline of its own (python -m captioning.web
in a subprocess): the server refuses the folder at start in one line naming the file, before the
tokenizers library sees it; it never starts to answer a prefix with the library's Rust panic as a
plain-text 500."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("tokenizers", reason="the subword extra: pip install -e '.[subword]'")

from captioning.cli import main  # noqa: E402
from captioning.tokenizers import build_tokenizer  # noqa: E402
from captioning.web.client import wait_for_server  # noqa: E402
from tests.helpers import free_port, jpeg_640x480, post_image  # noqa: E402


def test_a_tokenizer_file_with_a_native_normaliser_is_refused_when_the_server_starts(
    tiny_checkpoint, tiny_shapes, tmp_path
):
    folder = tmp_path / "model"
    assert main(["export", "--checkpoint", str(tiny_checkpoint), "--out", str(folder)]) == 0
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    tokenizer = build_tokenizer("bpe", vocab_size=len(vocab["itos"]))
    tokenizer.train([" ".join(vocab["itos"][4:])] * 5)
    state = json.loads(json.dumps(tokenizer.state()))
    state["model"]["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": "AAAA"}  # a Rust panic
    vocab.update(tokenizer="bpe", tokenizer_model=state)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "captioning.web", "--host", "127.0.0.1", "--port", str(port)]
            + ["--log-level", "warning", "--checkpoint", str(folder)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        problem = wait_for_server(url, proc, 180)
        if problem is None:  # it started: what a request with a prefix then gets
            image = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
            status, body = post_image(url, jpeg_640x480(image), prefix="a red")
            proc.terminate()
            proc.wait(timeout=30)
            pytest.fail(f"the server started with the crafted tokenizer file; a prefix got {status} {body}")
        proc.wait(timeout=60)
    text = log.read_text(errors="replace").strip()
    assert proc.returncode != 0 and "Traceback" not in text, text[-3000:]
    last = text.splitlines()[-1]
    assert "vocab.json" in last and "tokenizer_model" in last and "normalizer" in last, text[-3000:]
