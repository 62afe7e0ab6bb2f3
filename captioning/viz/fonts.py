"""Fonts for the words written on pictures: a font with CJK glyphs where the words need one.

Pillow's default font has Latin glyphs only: Chinese or Japanese titles would be drawn as boxes.
:func:`text_font` gives the default font for text it covers. For text with CJK characters it
gives a CJK font found at run time. It looks for the file named by ``CAPTIONING_CJK_FONT`` (any
.ttf/.ttc/.otf, e.g. one the system already has: no download), else the ``cjk-font`` extra's (``pip install -e
'.[cjk-font]'``: Noto Sans CJK from PyPI, no root needed), else a Debian, macOS or Windows font at
its usual place (fonts-noto-cjk, fonts-wqy-microhei, ...; PingFang, Hiragino; Microsoft YaHei,
SimHei), else fontconfig's answer for ``:lang=zh``. In a collection (.ttc) the Simplified Chinese
face is used, in a variable font its Regular weight. Without any font, one warning says so and
how to get one, and the default font is used (boxes, but never silently).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence

from PIL import ImageFont

from captioning.tokenizers import is_cjk

log = logging.getLogger(__name__)

CJK_FONT_ENV = "CAPTIONING_CJK_FONT"
CJK_FONT_FILES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/opentype/noto/NotoSerifCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/arphic/uming.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
    "/usr/share/fonts/google-noto-cjk/NotoSansCJK-Regular.ttc",  # Fedora
    "/System/Library/Fonts/PingFang.ttc",
    "/System/Library/Fonts/Hiragino Sans GB.ttc",
    "/Library/Fonts/Arial Unicode.ttf",
    "C:\\Windows\\Fonts\\msyh.ttc",
    "C:\\Windows\\Fonts\\simhei.ttf",
)
#: the ``cjk-font`` extra's package (pyproject.toml): Noto Sans CJK (SIL Open Font License 1.1), a
#: 20 MB download, found beside its module without importing it
FONT_PACKAGE = "manimgx_fonts_cjk"
INSTALL_HINT = (
    "pip install -e '.[cjk-font]' (Noto Sans CJK, no root needed), or apt-get install fonts-noto-cjk, "
    f"or set {CJK_FONT_ENV} to a .ttf/.ttc/.otf file you have"
)


def has_cjk(texts: str | Sequence[str]) -> bool:
    """Whether any of ``texts`` holds a CJK character."""
    texts = [texts] if isinstance(texts, str) else texts
    return any(is_cjk(c) for text in texts for c in text)


@functools.lru_cache(maxsize=1)
def cjk_font_path() -> str | None:
    """The file of a font with CJK glyphs (looked up once per process), or None."""
    named = os.environ.get(CJK_FONT_ENV)
    if named:
        if os.path.isfile(named):
            return named
        log.warning("%s=%s: no such font file; looking for another CJK font", CJK_FONT_ENV, named)
    packaged = package_font()
    if packaged is not None:
        return packaged
    for path in CJK_FONT_FILES:
        if os.path.isfile(path):
            return path
    if shutil.which("fc-match"):
        try:
            found = subprocess.run(
                ["fc-match", "-f", "%{file}", ":lang=zh"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            found = ""
        if found and os.path.isfile(found) and _draws_cjk(found):
            return found
    return None


def package_font(package: str = FONT_PACKAGE) -> str | None:
    """The font file the ``cjk-font`` extra installed (the first .ttc/.otf/.ttf in ``package``'s
    folder), or None when it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        found = sorted(f for f in os.listdir(folder) if f.lower().endswith((".ttc", ".otf", ".ttf")))
        if found:
            return os.path.join(folder, found[0])
    return None


@functools.lru_cache(maxsize=32)
def open_font(path: str, size: int) -> ImageFont.FreeTypeFont:
    """The font at ``path`` in ``size`` pixels: a collection's Simplified Chinese face (a family
    named "... SC", "... GB" or "... Hans"; else its first), a variable font at its Regular weight."""
    font = ImageFont.truetype(path, size)
    if path.lower().endswith((".ttc", ".otc")):
        for index in range(1, 16):
            family = (font.getname()[0] or "").split()
            if family and family[-1] in ("SC", "GB", "Hans"):
                break
            try:
                font = ImageFont.truetype(path, size, index=index)
            except OSError:  # past the collection's last face
                font = ImageFont.truetype(path, size)
                break
    try:
        if b"Regular" in font.get_variation_names():
            font.set_variation_by_name("Regular")  # a variable font's default may be its thinnest
    except (OSError, AttributeError):  # not a variable font (or a FreeType without variations)
        pass
    return font


def _draws_cjk(path: str) -> bool:
    """Whether the font at ``path`` has a glyph for 中 (fontconfig falls back to any font)."""
    try:
        font = ImageFont.truetype(path, 16)
    except OSError:
        return False
    return glyph(font, "中") != glyph(font, "\ue000")  # a private-use character: the font's missing-glyph box


def glyph(font: ImageFont.ImageFont, char: str) -> bytes:
    """The pixels ``font`` draws for ``char`` (what tells a glyph from the missing-glyph box)."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (48, 48))
    ImageDraw.Draw(image).text((4, 4), char, font=font, fill=255)
    return image.tobytes()


@functools.lru_cache(maxsize=1)
def _warn_no_cjk_font() -> None:
    log.warning("pictures: no font with CJK glyphs found, so CJK words are drawn as boxes; %s", INSTALL_HINT)


def default_font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def text_font(size: int, texts: str | Sequence[str] = ()) -> ImageFont.ImageFont:
    """A font of ``size`` pixels that draws ``texts``: Pillow's default, or a CJK font for CJK text
    (one warning, then the default, where none is found)."""
    if has_cjk(texts):
        path = cjk_font_path()
        if path is not None:
            try:
                return open_font(path, size)
            except OSError as err:
                log.warning("pictures: cannot open the CJK font %s (%s); %s", path, err, INSTALL_HINT)
        else:
            _warn_no_cjk_font()
    return default_font(size)


def gap(left: str, right: str) -> str:
    """The space drawn between two words: none where either side is CJK (tokenizers.join_words)."""
    return "" if not left or not right or is_cjk(left[-1]) or is_cjk(right[0]) else " "


SUBWORD_MARK = "\u2581"  # "▁": a subword token that starts a word (tokenizers.SubwordTokenizer)


def shown_words(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """(each token as drawn, the space drawn after it): subword tokens without their "▁", a space
    only before a token that starts a word; other tokens as :func:`gap` spaces them."""
    words = list(words)
    if any(w.startswith(SUBWORD_MARK) for w in words):
        texts = [w.lstrip(SUBWORD_MARK) for w in words]
        after = [" " if nxt.startswith(SUBWORD_MARK) else "" for nxt in words[1:]]
    else:
        texts = words
        after = [gap(a, b) for a, b in zip(words, words[1:])]
    return texts, after + [""] * bool(words)
