"""Fonts for the words written on pictures: a font with CJK glyphs where the words need one.

Pillow's default font has Latin glyphs only: Chinese or Japanese titles would be drawn as boxes.
:func:`text_font` gives the default font for text it covers and, for text with CJK characters, a
CJK font found at run time: the file named by ``CAPTIONING_CJK_FONT``, else a Debian, macOS or
Windows font at its usual place (fonts-noto-cjk, fonts-wqy-microhei, fonts-wqy-zenhei,
fonts-arphic-uming, fonts-droid-fallback; PingFang, Hiragino; Microsoft YaHei, SimHei), else
fontconfig's answer for ``:lang=zh``. Without any, one warning says so and how to install one, and
the default font is used (boxes, but never silently).
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
INSTALL_HINT = (
    "install one (Debian/Ubuntu: apt-get install fonts-noto-cjk, or fonts-wqy-microhei) "
    f"or set {CJK_FONT_ENV} to a .ttf/.ttc/.otf file"
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
                return ImageFont.truetype(path, size)
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
