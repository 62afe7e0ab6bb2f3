"""The form's decoding fields derived from GenerationConfig's options, the statuses of the error
types, and the GIF budget measured by the functions that draw the frames."""

import io

import pytest
from PIL import Image

from tests.helpers import FakeCaptioner, get_json, post_image

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("multipart", reason="the web extra is not installed: pip install -e '.[web]'")


def png_bytes(size=(96, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


class RecordingCaptioner(FakeCaptioner):
    """FakeCaptioner that takes every decoding keyword, as the Captioner does (checked by
    GenerationConfig), and records them."""

    def __call__(self, images, return_attention=False, **generation):
        self.generation.replace(**generation)  # the Captioner's own check
        out = super().__call__(
            images, num_beams=generation["num_beams"], num_return_sequences=generation["num_return_sequences"]
        )
        self.calls[-1] = generation
        return out


def out_of_bounds(option) -> str:
    """A text the option refuses: below its least or above its largest value, not one of its choices."""
    if option.type is bool:
        return "maybe"
    if option.type is str:
        return "nonsense"
    if option.type is tuple:
        return "-3"
    if option.min is not None:
        return str(option.min - 1 if option.min_inclusive else option.min)
    if option.max is not None:
        return str(option.max + 1 if option.max_inclusive else option.max)
    return "nan" if option.type is float else "x"


def test_the_form_fields_are_the_web_options_of_generation_config():
    from captioning.decoding.generation import generation_options
    from captioning.web.settings import CAPS, form_options

    web = [o.name for o in generation_options() if o.web]
    assert list(form_options()) == web and "cuda_graphs" not in web
    assert {"temperature", "top_k", "top_p", "no_repeat_ngram_size", "suppress_tokens"} <= set(web)
    for name, (low, high) in CAPS.items():  # the server's caps narrow the options' own bounds
        option = form_options()[name]
        assert option.min >= low and option.max <= high, option


def another_value(option) -> str:
    """A text of a valid value other than the option's default."""
    if option.type is bool:
        return str(not option.default).lower()
    if option.type is str:
        return next(c for c in option.choices if c != option.default)
    if option.type is tuple:
        return "3"  # a token id of FakeCaptioner's vocabulary
    value = option.default + (1 if option.type is int else 0.5)
    if option.max is not None and value > option.max:
        value = (option.min + option.max) / 2
    return str(value)


#: requests the fields are tried in, in turn, until GenerationConfig accepts the combination
#: (sampling wants one beam; beam groups want beams they divide)
BASES = [{}, {"num_beams": "1", "do_sample": "true"}, {"num_beams": "4", "num_beam_groups": "2"}]


def test_every_web_field_reaches_the_model_and_its_bounds_answer_400(served):
    """Every option marked ``web`` is a field of POST /api/caption: a value other than its default
    is handed to the captioner; a value outside its bounds is a 400 naming the field."""
    from captioning.web.settings import FOCUS_FIELDS, form_options

    fake = RecordingCaptioner()
    server = served(fake)
    status, info = get_json(server.url, "/api/models")  # the page draws an input for each option it lacks
    assert status == 200 and [o["name"] for o in info["options"]] == list(form_options()) + list(FOCUS_FIELDS)
    assert {o["name"]: o["max"] for o in info["options"]}["num_beams"] == 10
    for name, option in form_options().items():
        text = another_value(option)
        answers = []
        for base in BASES:
            status, out = post_image(server.url, png_bytes(), **{**base, name: text})
            answers.append((status, out.get("error")))
            if status == 200:
                break
        assert status == 200, (name, text, answers)
        assert fake.calls[-1][name] == option.parse(text) and out["settings"][name] is not None, (name, fake.calls[-1])
    for name, option in form_options().items():
        text = out_of_bounds(option)
        status, out = post_image(server.url, png_bytes(), **{name: text})
        assert status == 400 and out["error"].startswith(f"{name}: "), (name, text, status, out)


def test_a_new_decoding_option_reaches_the_form(monkeypatch):
    """An option added to GenerationConfig's metadata is a form field, parsed and bounded by its metadata."""
    import dataclasses

    from captioning.decoding import generation
    from captioning.web import settings
    from captioning.web.errors import RequestError

    new = generation.GenerationOption(name="length_bonus", type=float, default=0.0, help="a test option", min=0, max=2)
    options = generation.generation_options() + [new]
    monkeypatch.setattr(settings, "generation_options", lambda: options)
    settings.form_options.cache_clear()
    try:
        assert settings.Settings.parse({"length_bonus": "1.5"}, hard=False).length_bonus == 1.5
        with pytest.raises(RequestError, match=r"length_bonus: expected a finite number in \[0, 2\], got 3"):
            settings.Settings.parse({"length_bonus": "3"}, hard=False)
        hidden = [dataclasses.replace(o, web=False) if o.name == "top_k" else o for o in options]
        monkeypatch.setattr(settings, "generation_options", lambda: hidden)
        settings.form_options.cache_clear()
        assert "top_k" not in settings.form_options()
        assert settings.Settings.parse({"top_k": "5"}, hard=False).as_dict().get("top_k") is None
    finally:
        monkeypatch.undo()
        settings.form_options.cache_clear()


# ---------------------------------------------------------------------- statuses from types
def test_each_error_type_has_its_status():
    from captioning.errors import CaptioningError
    from captioning.web import errors

    statuses = {
        errors.RequestError: 400,
        errors.NotFound: 404,
        errors.MethodNotAllowed: 405,
        errors.BodyTimeout: 408,
        errors.TooLarge: 413,
        errors.UploadTooLarge: 413,
        errors.UnsupportedMedia: 415,
        errors.InternalError: 500,
        errors.Busy: 503,
    }
    for kind, status in statuses.items():
        assert issubclass(kind, CaptioningError) and kind.status == status, kind
    assert errors.Busy.headers == {"Retry-After": "1"} and errors.BodyTimeout.headers == {"Connection": "close"}
    assert str(errors.UploadTooLarge(errors.MB)) == "upload too large: the limit is 1 MB"
    assert str(errors.BodyTimeout(1.5)) == "the request's body was not sent within 1.5 s"


def test_an_unreadable_upload_is_typed_by_what_is_wrong(tmp_path, monkeypatch):
    from captioning.data.images import load_image
    from captioning.errors import ImageError
    from captioning.web import errors

    def refused(data: bytes, name: str) -> errors.RequestError:
        path = tmp_path / "x.upload"
        path.write_bytes(data)
        with pytest.raises(ImageError) as info:
            load_image(path)
        return errors.upload_error(info.value, str(path), name)

    not_image = refused(b"hello, not a picture\n" * 10, "notes.png")
    assert type(not_image) is errors.UnsupportedMedia and str(not_image).startswith("notes.png: not an image file")
    pdf = refused(b"%PDF-1.4 not a picture\n" * 10, "doc.png")
    assert type(pdf) is errors.UnsupportedMedia
    truncated = refused(png_bytes((640, 480))[:200], "cut.png")
    assert type(truncated) is errors.RequestError and "cut.png: unreadable image" in str(truncated)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    bomb = refused(png_bytes((100, 100)), "bomb.png")
    assert type(bomb) is errors.TooLarge and str(tmp_path) not in str(bomb)
    assert str(bomb).endswith("(possible decompression bomb; the server's limit, set by its --max-pixels option)")


# ---------------------------------------------------------------------- the GIF budget
def test_a_gif_within_its_budget_is_the_one_the_pictures_draw():
    import numpy as np

    from captioning.viz import pictures
    from captioning.web.gifs import MIN_GIF_SIDE, budgeted_gif

    image = Image.new("RGB", (400, 300), (90, 120, 200))
    words = ["a", "red", "square", "above", "a", "blue", "circle"]
    maps = np.random.default_rng(0).random((len(words), 4, 4))
    width, height = pictures.gif_frame_size(image.size, words)
    whole = (len(words) + 1) * width * height
    gif, info = budgeted_gif(image, words, maps, None, max_pixels=whole)
    assert not info["shrunk"] and (info["width"], info["height"]) == (width, height)
    assert gif == pictures.gif_bytes(pictures.render_frames(image, words, maps))  # as Captioner.render draws it
    for budget in (whole - 1, whole // 3):
        gif, info = budgeted_gif(image, words, maps, None, max_pixels=budget)
        shown = Image.open(io.BytesIO(gif))
        assert info["shrunk"] and shown.n_frames * shown.width * shown.height <= budget == info["budget_pixels"]
        assert [info["width"], info["height"]] == list(shown.size)
    gif, info = budgeted_gif(image, words, maps, None, max_pixels=8 * MIN_GIF_SIDE * MIN_GIF_SIDE // 4)
    assert gif is None and "do not fit the server's GIF budget" in info["left_out"]


@pytest.mark.parametrize(
    "field", ["header_timeout", "body_timeout", "request_timeout", "send_timeout", "stuck_after", "keep_alive"]
)
@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_deadline_is_a_positive_finite_number_of_seconds(field, value):
    from captioning.web.guard import Limits

    with pytest.raises(ValueError, match=f"^{field} must be a positive number of seconds"):
        Limits(**{field: value})
    assert getattr(Limits(**{field: 0.5}), field) == 0.5


@pytest.mark.parametrize(
    "flag", ["--header-timeout", "--body-timeout", "--send-timeout", "--request-timeout", "--stuck-after"]
)
def test_a_deadline_flag_of_nan_or_inf_is_one_line_before_anything_loads(flag, tmp_path, capsys):
    from captioning.web.__main__ import main

    for value in ("nan", "inf"):
        try:
            code = main(["--checkpoint", str(tmp_path / "absent.ckpt"), flag, value])
        except SystemExit as exit:  # the flag's own type refused it: argparse's usage line and its error
            code = exit.code
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code in (1, 2) and "Traceback" not in err and flag in last and value in last, err
        if code == 1:  # refused by Limits, through cmd_serve
            assert err == f"error: {flag} must be a positive number of seconds, got {value}\n", err
