"""A Chinese model served (python -m captioning.web in a subprocess): the API answers the caption as
the Captioner writes it, without spaces between Chinese words; a Chinese prefix from the form is
split by the model's tokenizer; the attention GIF and picture render, their words in a CJK font or,
without one, after the one warning that says so."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")

from captioning.tokenizers import is_cjk  # noqa: E402
from captioning.web.client import caption  # noqa: E402
from tests.helpers import ServerProcess, _connection, get_json, jpeg_640x480  # noqa: E402

WARNING = "no font with CJK glyphs found"


@pytest.fixture(scope="module")
def zh_server(tiny_zh_checkpoint, tmp_path_factory):
    proc = ServerProcess([f"zh={tiny_zh_checkpoint}"], log=tmp_path_factory.mktemp("web_zh_log") / "server.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def zh_images(tiny_shapes_zh, tmp_path_factory):
    folder = tmp_path_factory.mktemp("web_zh_images")
    paths = []
    for i, src in enumerate(sorted((tiny_shapes_zh.parent / "images" / "test").glob("*.png"))[:2]):
        paths.append(folder / f"照片{i}.jpg")  # a Chinese file name too
        paths[-1].write_bytes(jpeg_640x480(src))
    return paths


def decoded(data_url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1])))


def test_the_api_answers_chinese_captions_without_spaces_and_renders_them(zh_server, tiny_zh_checkpoint, zh_images):
    from captioning.api import Captioner
    from captioning.viz.fonts import cjk_font_path

    captioner = Captioner.from_checkpoint(tiny_zh_checkpoint, device="cpu")
    status, info = get_json(zh_server.url, "/api/models")
    assert status == 200 and info["models"][0]["name"] == "zh"
    assert info["models"][0]["description"]["training_data"].endswith("dataset_shapes.json")
    for path in zh_images:
        out = caption(path, url=zh_server.url, model="zh", num_beams=2, return_gif=True, return_image=True)
        [want] = captioner([str(path)], num_beams=2)
        text = out["generated_text"]
        assert text == want["generated_text"] and out["tokens"] == want["tokens"]
        assert text and " " not in text and any(map(is_cjk, text)), text
        words = [t for t in out["tokens"] if t != "<end>"]
        assert "".join(words) == text  # one character a token (chars), joined without spaces
        gif = decoded(out["gif"])
        assert gif.format == "GIF" and gif.n_frames == len(words) + 1
        assert decoded(out["image"]).size == (400, 300)
    # the picture's CJK words: in the font found here, or after the one warning (never boxes silently)
    log = zh_server.log()
    if cjk_font_path() is None:
        assert log.count(WARNING) == 1, log
    else:
        assert WARNING not in log, log
    # the page is UTF-8 and shows the API's text as it is
    conn = _connection(zh_server.url, 10)
    conn.request("GET", "/")
    response = conn.getresponse()
    page = response.read().decode("utf-8")
    conn.close()
    assert response.status == 200 and '<meta charset="utf-8">' in page
    assert "c.caption.textContent = result.generated_text" in page


def test_a_chinese_prefix_from_the_form_is_split_by_the_models_tokenizer(zh_server, zh_images):
    out = caption(zh_images[0], url=zh_server.url, model="zh", prefix="左上角有")
    assert out["generated_text"].startswith("左上角有") and out["tokens"][:4] == list("左上角有")
    from captioning.web.client import APIError

    with pytest.raises(APIError) as info:
        caption(zh_images[0], url=zh_server.url, model="zh", prefix="斑马")
    assert info.value.status == 400 and info.value.message.startswith("prefix: '斑马'")
    assert "\n" not in info.value.message
