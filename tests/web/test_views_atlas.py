"""The web page's views and its atlas: ``POST /api/caption`` with ``return_views`` answers the
Captioner's view arrays, the page has the view selector, ``GET /atlas`` answers the atlas page and
``POST /api/atlas`` every served model's panel (word, mechanism, object F1 of an example)."""

import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")

from captioning.api import Captioner  # noqa: E402
from captioning.viz.atlas import caption_f1, image_objects  # noqa: E402
from captioning.web.client import APIError, atlas, caption  # noqa: E402
from captioning.web.served import ServedModel  # noqa: E402
from tests.cli.test_attend_views import SETTINGS, tiny  # noqa: E402
from tests.helpers import shapes_test_images  # noqa: E402

KINDS = ("soft", "hard", "local", "transformer")


@pytest.fixture(scope="module")
def example(tiny_shapes):
    """A test image of the shapes data, whose objects its annotations give."""
    return Path(shapes_test_images(tiny_shapes, 1)[0])


@pytest.fixture
def server(serve_models, example):
    models = [ServedModel(kind, Captioner.from_model(tiny(kind), device="cpu"), examples=[example]) for kind in KINDS]
    return serve_models(models)


def page(url: str, path: str) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(url + path, timeout=30) as response:
        return response.status, response.read().decode()


def test_the_api_answers_the_views_of_the_captioner(server, example):
    from tests.helpers import get_json

    status, info = get_json(server.url, "/api/models")
    assert status == 200
    listed = {m["name"]: (m["views"], m["mechanism"]["name"]) for m in info["models"]}
    assert listed == {
        "soft": (["maps", "alignment", "gate"], "soft"),
        "hard": (["maps", "alignment", "gate", "sample"], "hard"),
        "local": (["maps", "alignment", "gate", "window"], "local"),
        "transformer": (["maps", "alignment", "self"], "transformer"),
    }
    for kind in KINDS:
        mode = {"attention_mode": "sample"} if kind == "hard" else {}
        out = caption(example, url=server.url, model=kind, num_beams=1, return_views=True, **SETTINGS, **mode)
        [want] = Captioner.from_model(tiny(kind), device="cpu")(example, return_views=True, **SETTINGS, **mode)
        assert out["tokens"] == want["tokens"]
        assert sorted(out["views"]) == sorted(want["views"])
        for name, array in want["views"].items():
            got = out["views"][name]
            assert got["shape"] == list(array.shape)
            np.testing.assert_allclose(np.array(got["values"]), array, atol=5e-5)  # rounded to 4 decimals
        assert "views" not in caption(example, url=server.url, model=kind, num_beams=1, **SETTINGS)


def test_the_page_has_the_view_selector_and_the_atlas_page_answers(server):
    status, html = page(server.url, "/")
    assert status == 200
    for view in ("maps", "alignment", "self", "gate", "window", "sample"):
        assert f'<option value="{view}">' in html
    assert 'id="view"' in html and "return_views" in html and 'href="/atlas?lang=en"' in html
    status, html = page(server.url, "/atlas")
    assert status == 200 and "/api/atlas" in html and "The attention atlas" in html


def test_the_atlas_api_gives_a_panel_per_model(server, example, tiny_shapes):
    """Every model's panel, the word each shows and its map; the example's objects give object F1."""
    results = {}
    for kind in KINDS:  # each model's caption with the server's default settings (as the page's)
        served = ServedModel(kind, Captioner.from_model(tiny(kind), device="cpu"))
        [results[kind]] = served.caption([Image.open(example).convert("RGB")], served.settings({}))
    word = results["soft"]["tokens"][1]
    out = atlas(example, url=server.url, word=word, example=0)
    assert [p["label"] for p in out["panels"]] == list(KINDS)
    assert [p["mechanism"] for p in out["panels"]] == list(KINDS)
    objects, _ = image_objects(example)
    assert objects
    for panel, kind in zip(out["panels"], KINDS):
        tokens = [t for t in results[kind]["tokens"] if t != "<end>"]
        assert panel["caption"] == " ".join(tokens) and panel["equations"]
        assert panel["index"] == (tokens.index(word) if word in tokens else None)
        if panel["index"] is not None:
            np.testing.assert_allclose(panel["attention"], results[kind]["attention"][panel["index"]], atol=5e-5)
        assert panel["object_f1"] == pytest.approx(caption_f1(tokens, objects))
    picture = Image.open(io.BytesIO(base64.b64decode(out["atlas"].split(",", 1)[1])))
    assert picture.format == "PNG" and picture.width > 4 * 200
    # an upload that is not an example: no object F1
    assert all(p["object_f1"] is None for p in atlas(example, url=server.url, word=word)["panels"])


@pytest.mark.parametrize("example, status, words", [("7", 404, "no example 7"), ("x", 400, "example: expected")])
def test_a_bad_example_is_a_4xx(server, example, status, words):
    image = io.BytesIO()
    Image.new("RGB", (32, 32), (90, 90, 90)).save(image, "PNG")
    with pytest.raises(APIError) as err:
        atlas(image.getvalue(), url=server.url, example=example)
    assert err.value.status == status and words in err.value.message
