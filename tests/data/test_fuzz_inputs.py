"""Property tests: random bytes, random small images in every mode and format, random text.

Whatever comes in, the only exceptions that come out are the project's own (one-line, user-facing).
"""

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, features

from captioning.data.images import load_image
from captioning.errors import ImageError
from captioning.tokenizers import tokenize
from captioning.vocab import Vocabulary

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Headers of real formats, so that random tails exercise the decoders, not only "unidentified".
HEADERS = [
    b"",
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff\xe0",
    b"GIF89a",
    b"II*\x00",
    b"MM\x00*",
    b"RIFF\x00\x00\x00\x00WEBP",
    b"BM",
    b"P6\n4 4\n255\n",
    b"<svg",
    b"\x00\x00\x01\x00",
]


@FAST
@given(head=st.sampled_from(HEADERS), tail=st.binary(min_size=0, max_size=600))
def test_random_bytes_give_an_rgb_image_or_an_image_error(tmp_path, head, tail):
    path = tmp_path / "x.img"
    path.write_bytes(head + tail)
    try:
        img = load_image(path)
    except ImageError as err:
        assert "\n" not in str(err) and str(path) in str(err)
    else:
        assert img.mode == "RGB" and img.width >= 1 and img.height >= 1


def _can_save(mode, fmt):
    if fmt == "WEBP" and not features.check("webp"):
        return False
    try:
        Image.new(mode, (2, 2)).save(io.BytesIO(), fmt)
        return True
    except (OSError, KeyError, ValueError, TypeError):
        return False


MODES = ["1", "L", "LA", "P", "RGB", "RGBA", "CMYK", "I;16", "I", "F"]
FORMATS = ["PNG", "JPEG", "GIF", "TIFF", "WEBP", "BMP"]
PAIRS = [(m, f) for m in MODES for f in FORMATS if _can_save(m, f)]


@FAST
@given(pair=st.sampled_from(PAIRS), w=st.integers(1, 40), h=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_random_images_in_every_mode_and_format_load_as_rgb(tmp_path, pair, w, h, seed):
    import numpy as np

    mode, fmt = pair
    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")
    img = (
        rgba.convert(mode)
        if mode not in ("I;16", "I", "F")
        else Image.fromarray(
            rng.integers(0, 65536, (h, w)).astype({"I;16": np.uint16, "I": np.int32, "F": np.float32}[mode])
        )
    )
    if mode == "I;16":
        img = img.convert("I;16") if img.mode != "I;16" else img
    path = tmp_path / f"x.{fmt.lower()}"
    img.save(path, fmt)
    out = load_image(path)
    assert out.mode == "RGB" and out.size == (w, h)


VOCAB = Vocabulary.build([["a", "red", "circle", "café", "über"]], min_freq=1)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80), ids=st.lists(st.integers(-5, 40), max_size=20), cut=st.none() | st.integers(0, 10))
def test_random_text_tokenizes_encodes_and_decodes(text, ids, cut):
    tokens = tokenize(text)
    assert all(isinstance(t, str) and t and t == t.lower() for t in tokens)  # non-empty, lower-cased words
    encoded = VOCAB.encode(tokens, cut)
    assert encoded[0] == VOCAB.bos_id and encoded[-1] == VOCAB.eos_id
    assert len(encoded) == 2 + (len(tokens) if cut is None else min(cut, len(tokens)))
    known = [t if t in VOCAB else VOCAB.UNK for t in (tokens if cut is None else tokens[:cut])]
    assert VOCAB.decode(encoded) == known  # what was encoded comes back, unknown words as <unk>
    assert isinstance(VOCAB.decode_text(ids), str)  # any ids, even out of range, decode to text
