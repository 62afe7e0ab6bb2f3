"""CJK words on pictures: a font with their glyphs where one is installed, else one warning and the
default font (boxes, never silently); no space drawn between CJK words."""

import logging

import numpy as np
import pytest
from PIL import Image, ImageFont

from captioning.viz import fonts
from captioning.viz.fonts import cjk_font_path, default_font, gap, glyph, shown_words, text_font
from captioning.viz.pictures import render_frames, render_grid


@pytest.fixture
def fresh_lookup():
    cjk_font_path.cache_clear()
    fonts._warn_no_cjk_font.cache_clear()
    yield
    cjk_font_path.cache_clear()
    fonts._warn_no_cjk_font.cache_clear()


def test_the_default_font_has_no_cjk_glyphs_and_a_found_font_has():
    assert glyph(default_font(16), "中") == glyph(default_font(16), "\ue000")  # what the fallback draws: a box
    if cjk_font_path() is None:
        pytest.skip("no CJK font installed here (apt-get install fonts-noto-cjk or fonts-wqy-microhei)")
    font = text_font(16, ["左上角", "红色"])
    assert glyph(font, "中") != glyph(font, "\ue000")
    assert text_font(16, ["a", "red", "circle"]).getlength("a") == default_font(16).getlength("a")  # Latin: as before


def test_without_a_cjk_font_one_warning_then_the_default(monkeypatch, caplog, fresh_lookup, tmp_path):
    monkeypatch.setattr(fonts, "CJK_FONT_FILES", ())
    monkeypatch.setattr(fonts, "package_font", lambda: None)
    monkeypatch.setattr(fonts.shutil, "which", lambda name: None)
    monkeypatch.setenv(fonts.CJK_FONT_ENV, str(tmp_path / "missing.ttf"))
    with caplog.at_level(logging.WARNING, logger="captioning.viz.fonts"):
        for _ in range(3):
            font = text_font(16, ["红色"])
    messages = [r.getMessage() for r in caplog.records]
    assert sum("no font with CJK glyphs found" in m for m in messages) == 1
    assert any("missing.ttf: no such font file" in m for m in messages)
    assert all("\n" not in m for m in messages) and "fonts-noto-cjk" in messages[-1]
    assert "pip install -e '.[cjk-font]'" in messages[-1] and fonts.CJK_FONT_ENV in messages[-1]  # routes without root
    assert glyph(font, "中") == glyph(default_font(16), "中")


def test_the_environment_names_the_font(monkeypatch, fresh_lookup):
    path = cjk_font_path()
    if path is None:
        pytest.skip("no CJK font installed here")
    cjk_font_path.cache_clear()
    monkeypatch.setattr(fonts, "CJK_FONT_FILES", ())
    monkeypatch.setenv(fonts.CJK_FONT_ENV, path)
    assert cjk_font_path() == path


def test_cjk_words_are_drawn_without_spaces_and_titled_in_grids():
    assert gap("红色", "圆形") == "" and gap("a", "dog") == " " and gap("3", "个") == ""
    assert shown_words(["▁a", "▁re", "d", "▁circle"]) == (["a", "re", "d", "circle"], [" ", "", " ", ""])
    assert shown_words(["红色", "的", "a", "dog"]) == (["红色", "的", "a", "dog"], ["", "", " ", ""])
    image = Image.fromarray(np.full((32, 32, 3), 128, np.uint8))
    words = ["左上角", "有", "一个", "红色", "的", "星形"]
    maps = np.full((len(words), 2, 2), 0.25)
    frames = render_frames(image, words, maps)
    assert len(frames) == len(words) + 1 and len({f.size for f in frames}) == 1
    grid = render_grid(image, words, maps, cols=3)
    assert grid.size[0] > 3 * 32


def test_the_pip_extras_font_is_found_without_root(monkeypatch, fresh_lookup, tmp_path):
    """The cjk-font extra installs a package holding the font file: it is found beside the package,
    after CAPTIONING_CJK_FONT and before the system's fonts."""
    package = tmp_path / "site" / "fake_cjk_fonts"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "NotoSansCJK-VF.otf.ttc").write_bytes(b"font")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert fonts.package_font("fake_cjk_fonts") == str(package / "NotoSansCJK-VF.otf.ttc")
    assert fonts.package_font("no_such_font_package") is None
    monkeypatch.setattr(fonts, "FONT_PACKAGE", "fake_cjk_fonts")
    monkeypatch.setattr(fonts, "package_font", lambda: str(package / "NotoSansCJK-VF.otf.ttc"))
    monkeypatch.delenv(fonts.CJK_FONT_ENV, raising=False)
    assert cjk_font_path() == str(package / "NotoSansCJK-VF.otf.ttc")
    cjk_font_path.cache_clear()
    own = tmp_path / "mine.ttf"
    own.write_bytes(b"font")
    monkeypatch.setenv(fonts.CJK_FONT_ENV, str(own))  # a file the user has: no download
    assert cjk_font_path() == str(own)


def test_a_collection_draws_in_its_simplified_chinese_face_at_regular_weight(fresh_lookup):
    path = fonts.package_font() or cjk_font_path()
    if path is None or not path.lower().endswith(".ttc"):
        pytest.skip("no CJK font collection here (pip install -e '.[cjk-font]')")
    font = fonts.open_font(path, 24)
    families = []  # the collection's faces, in order (Noto CJK's name their region: "... SC")
    for index in range(16):
        try:
            families.append(ImageFont.truetype(path, 24, index=index).getname()[0])
        except OSError:
            break
    simplified = [f for f in families if f.split()[-1] in ("SC", "GB", "Hans")]
    assert font.getname()[0] == (simplified or families)[0], (font.getname(), families)
    assert glyph(font, "，") != glyph(font, "\ue000")  # the references' punctuation has glyphs too
    try:
        names = font.get_variation_names()
    except OSError:  # not a variable font
        return
    assert b"Regular" not in names or font.getname()[1] == "Regular"
