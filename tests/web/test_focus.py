"""Focus in the HTTP API: ``focus`` (a box in the upload's pixels) and ``focus_strength`` give the
Captioner's focused captions and maps; every bad value is a 400 in one line."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")

from captioning.web.client import APIError, caption  # noqa: E402
from tests.helpers import FakeCaptioner, get_json, jpeg_640x480, post_image  # noqa: E402

W, H = 640, 480  # the uploads' size: the 64 x 64 shapes images stretched


@pytest.fixture(scope="module")
def two_object_image(tiny_shapes, tmp_path_factory):
    """A test image with two objects as a 640 x 480 JPEG file, and its objects' boxes in that file's pixels."""
    data = json.loads(tiny_shapes.read_text())
    image = next(i for i in data["images"] if len(i["objects"]) >= 2)
    src = tiny_shapes.parent / image["filepath"] / image["filename"]
    path = tmp_path_factory.mktemp("focus_web") / "photo.jpg"
    path.write_bytes(jpeg_640x480(src))
    sx, sy = W / image["width"], H / image["height"]
    boxes = [(x0 * sx, y0 * sy, x1 * sx, y1 * sy) for x0, y0, x1, y1 in (o["bbox"] for o in image["objects"])]
    return path, boxes


@pytest.fixture(scope="module")
def captioner(tiny_checkpoint):
    from captioning.api import Captioner

    return Captioner.from_checkpoint(tiny_checkpoint, device="cpu")


def _text(box) -> str:
    return ",".join(f"{v:g}" for v in box)


def _same(out: dict, want: dict) -> None:
    assert out["generated_text"] == want["generated_text"] and out["tokens"] == want["tokens"]
    assert out["score"] == pytest.approx(want["score"], abs=1e-4)
    np.testing.assert_allclose(np.array(out["attention"]), want["attention"], atol=1e-4)
    assert [tuple(c) for c in out["locations"]] == [tuple(c) for c in want["locations"]]


def test_the_api_focus_is_the_captioners(served, captioner, two_object_image):
    path, boxes = two_object_image
    server = served(captioner)
    plain = caption(path, url=server.url, num_beams=3)
    assert plain["focus"] is None
    for box, strength in ((boxes[0], 5.0), (boxes[1], 1e4), ((0, 0, W, H), 10.0)):
        out = caption(path, url=server.url, num_beams=3, focus=_text(box), focus_strength=strength)
        [want] = captioner([str(path)], return_attention=True, num_beams=3, focus=box, focus_strength=strength)
        _same(out, want)
        assert out["focus"] == {"box": [pytest.approx(v) for v in box], "strength": strength}
    # a strong focus puts every map in the box's cells (the plain answer's maps are not so)
    x0, y0, x1, y1 = boxes[1]
    gh, gw = out["attention_shape"][1:]
    strong = caption(path, url=server.url, num_beams=3, focus=_text(boxes[1]), focus_strength=1e4)
    from captioning.decoding.steering import cell_coverage

    inside = cell_coverage(boxes[1], W, H, gh, gw).view(gh, gw).numpy() > 0
    assert np.array(strong["attention"])[:, inside].sum(-1).min() > 0.99
    assert np.array(plain["attention"])[:, inside].sum(-1).min() < 0.99
    # the default strength is 10; a tuple box is sent comma-separated by the client; strength 0 is no focus
    out = caption(path, url=server.url, num_beams=3, focus=boxes[0])
    [want] = captioner([str(path)], return_attention=True, num_beams=3, focus=boxes[0])
    _same(out, want)
    assert out["focus"]["strength"] == 10.0
    zero = caption(path, url=server.url, num_beams=3, focus=boxes[0], focus_strength=0)
    assert (zero["generated_text"], zero["score"], zero["attention"]) == (
        plain["generated_text"],
        plain["score"],
        plain["attention"],
    )


def test_focused_and_plain_requests_at_once_each_get_their_own(served, captioner, two_object_image):
    """Simultaneous requests: each focused one is captioned with its own box; the plain ones without."""
    path, boxes = two_object_image
    server = served(captioner, max_batch=8)
    asks = [dict(focus=_text(b), focus_strength=s) for b in boxes[:2] for s in (3.0, 1e4)] + [{}, {}]
    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(lambda kw: caption(path, url=server.url, num_beams=2, **kw), asks))
    for kw, out in zip(asks, answers):
        box = tuple(float(v) for v in kw["focus"].split(",")) if kw else None
        [want] = captioner(
            [str(path)], return_attention=True, num_beams=2, focus=box, focus_strength=kw.get("focus_strength")
        )
        _same(out, want)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"focus": "0,0,700,10"}, "focus: the box (0, 0, 700, 10) is outside the 640x480 image of photo.jpg"),
        ({"focus": "-1,0,10,10"}, "is outside the 640x480 image"),
        ({"focus": "4,4,4,10"}, "focus: the box (4, 4, 4, 10) has zero area"),
        ({"focus": "9,0,4,10"}, "focus: the box (9, 0, 4, 10) is inverted (expected x0 < x1 and y0 < y1)"),
        ({"focus": "1,2,3"}, "focus: expected four finite numbers x0,y0,x1,y1"),
        ({"focus": "a,b,c,d"}, "focus: expected four numbers x0,y0,x1,y1"),
        ({"focus": "nan,0,10,10"}, "focus: expected four finite numbers"),
        ({"focus": "0,0,10,10", "focus_strength": "-1"}, "focus_strength: expected a finite number >= 0, got -1"),
        ({"focus": "0,0,10,10", "focus_strength": "inf"}, "focus_strength: expected a finite number >= 0, got inf"),
        ({"focus": "0,0,10,10", "focus_strength": "nan"}, "focus_strength: expected a finite number >= 0, got nan"),
        ({"focus": "0,0,10,10", "focus_strength": "strong"}, "focus_strength: expected a finite number >= 0"),
        ({"focus_strength": "-2"}, "focus_strength: expected a finite number >= 0, got -2"),
    ],
)
def test_bad_focus_is_a_400_in_one_line(served, captioner, two_object_image, fields, message):
    path, _ = two_object_image
    server = served(captioner)
    status, out = post_image(server.url, path.read_bytes(), filename="photo.jpg", num_beams="2", **fields)
    assert status == 400 and message in out["error"] and "\n" not in out["error"], (status, out)
    with pytest.raises(APIError) as info:  # the Python client says the same
        caption(path, url=server.url, num_beams=2, **fields)
    assert info.value.status == 400
    assert caption(path, url=server.url, num_beams=2)["generated_text"]  # the server goes on


def test_the_fields_are_listed_and_a_model_without_scores_refuses_a_focus(served, two_object_image):
    path, _ = two_object_image
    server = served(FakeCaptioner())
    status, info = get_json(server.url, "/api/models")
    options = {o["name"]: o for o in info["options"]}
    assert status == 200 and options["focus"]["type"] == "box" and options["focus_strength"]["default"] == 10.0
    assert options["focus_strength"]["min"] == 0
    status, out = post_image(server.url, path.read_bytes(), focus="0,0,10,10")
    assert status == 400 and out["error"].startswith("focus: this model has no attention scores to steer"), out
    assert post_image(server.url, path.read_bytes())[0] == 200


def test_jobs_share_a_call_only_with_the_same_strength():
    from captioning.web.service import Job
    from captioning.web.settings import Focus, Settings

    model = object()
    plain = Job(model, Settings(), "u", "a.jpg")
    a = Job(model, Settings(), "u", "b.jpg", focus=Focus((0, 0, 5, 5), 10.0))
    b = Job(model, Settings(), "u", "c.jpg", focus=Focus((1, 1, 9, 9), 10.0))
    c = Job(model, Settings(), "u", "d.jpg", focus=Focus((0, 0, 5, 5), 3.0))
    assert a.shares_call(b) and not a.shares_call(c) and not a.shares_call(plain) and not plain.shares_call(a)
    assert plain.shares_call(Job(model, Settings(), "u", "e.jpg"))
    assert not plain.shares_call(Job(model, Settings(num_beams=1), "u", "e.jpg"))


def test_the_command_line_client_sends_a_focus(served, captioner, two_object_image, capsys):
    from captioning.web.client import main

    path, boxes = two_object_image
    server = served(captioner)
    assert (
        main([str(path), "--url", server.url, "--num-beams", "2", "--focus", _text(boxes[1]), "--focus-strength", "50"])
        == 0
    )
    [want] = captioner([str(path)], num_beams=2, focus=boxes[1], focus_strength=50)
    assert capsys.readouterr().out.startswith(f"{path}: {want['generated_text']}  (")
    assert main([str(path), "--url", server.url, "--focus", "5,5,5,9"]) == 1
    assert "HTTP 400: focus: the box (5, 5, 5, 9) has zero area" in capsys.readouterr().err


def test_a_served_ensemble_of_two_image_sizes_is_focused_as_the_captioner(
    served, tmp_path, two_object_image, tiny_model
):
    """Members reading 32 and 48 px: the server hands the decoded upload itself to the captioner
    (no shared resize), the box stays in the upload's pixels, and each member reads the box."""
    from captioning.api import Captioner
    from captioning.decoding.generation import GenerationConfig
    from captioning.storage.folder import save_folder

    folders = []
    for seed, kind, size in ((3, "soft", 32), (4, "hard", 48)):
        model = tiny_model(
            kind,
            encoder={"channels": (4, 8)},
            vocab=["a", "red", "blue", "circle", "square", "and"],
            seed=seed,
            image_size=size,
            generation=GenerationConfig(max_new_tokens=10),
        )
        folders.append(save_folder(tmp_path / kind, model.eval(), {}, model.spec))
    ensemble = Captioner.from_checkpoints(folders, device="cpu")
    path, boxes = two_object_image
    server = served(ensemble)
    out = caption(path, url=server.url, num_beams=2, focus=boxes[0], focus_strength=1e4)
    [want] = ensemble([str(path)], return_attention=True, num_beams=2, focus=boxes[0], focus_strength=1e4)
    _same(out, want)
    gh, gw = out["attention_shape"][1:]
    from captioning.decoding.steering import cell_coverage

    inside = cell_coverage(boxes[0], W, H, gh, gw).view(gh, gw).numpy() > 0
    assert np.array(out["attention"])[:, inside].sum(-1).min() > 0.99
