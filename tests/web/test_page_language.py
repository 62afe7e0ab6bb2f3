"""The web page in English and in Chinese: one table of strings (captioning/web/page.py: STRINGS), the
Chinese page without an English word outside the names it keeps, the language chosen by ``?lang=``,
``serve --lang`` or the browser's Accept-Language header, and ``--lang xx`` refused in one line."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from captioning.web.page import ATLAS_PAGE, KEPT, LANGUAGES, PAGE, STRINGS, atlas_page, choose_language, page

#: attributes a reader sees (tooltips, placeholders, what a screen reader says)
SHOWN_ATTRIBUTES = ("title", "alt", "placeholder", "aria-label")
LATIN = re.compile(r"[A-Za-z]")


class VisibleText(HTMLParser):
    """The text nodes outside <script> and <style>, the shown attributes' values, and the script."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []
        self.script = ""
        self._inside: list[str] = []

    def handle_starttag(self, tag, attrs):
        self._inside.append(tag)
        self.texts += [value for name, value in attrs if name in SHOWN_ATTRIBUTES and value]

    def handle_endtag(self, tag):
        if self._inside and self._inside[-1] == tag:
            self._inside.pop()

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self._inside.pop()

    def handle_data(self, data):
        tag = self._inside[-1] if self._inside else ""
        if tag == "script":
            self.script += data
        elif tag != "style" and data.strip():
            self.texts.append(data.strip())


def visible(html: str) -> VisibleText:
    parser = VisibleText()
    parser.feed(html)
    return parser


def without_kept(text: str) -> str:
    """``text`` less the names the Chinese page keeps and the ``{value}`` slots the script fills."""
    for name in KEPT:
        text = text.replace(name, "")
    return re.sub(r"\{\w+\}", "", text)


def test_every_string_has_both_languages_and_the_chinese_ones_are_chinese():
    for key, column in STRINGS.items():
        assert set(column) == set(LANGUAGES), key
        slots = {lang: set(re.findall(r"\{(\w+)\}", text)) for lang, text in column.items()}
        assert len({frozenset(s) for s in slots.values()}) == 1 or key == "option_label", (key, slots)
        assert not LATIN.search(without_kept(column["zh"])), (key, column["zh"])


def test_the_page_uses_exactly_the_table():
    """Every ``{{key}}`` of the HTML and ``t("key")`` of the script is in the table, and every entry is used."""
    both = PAGE + ATLAS_PAGE
    used = set(re.findall(r"\{\{(\w+)\}\}", both)) | set(re.findall(r"""\bt\(\s*["'](\w+)["']""", both))
    filled_by_page = {"lang", "html_lang", "other_lang", "other_html_lang", "other_language", "strings_json"}
    assert used - filled_by_page - set(STRINGS) == set()  # no key the table lacks
    rows = set(re.findall(r'\["(row_\w+)"', PAGE))  # the description's rows, looked up as t(k)
    assert set(STRINGS) - used - rows == set()  # no entry left unused


@pytest.mark.parametrize("make", [page, atlas_page], ids=["page", "atlas"])
def test_the_chinese_page_has_no_english_ui_string(make):
    zh = make("zh")
    assert '<html lang="zh-CN">' in zh and "{{" not in zh
    shown = visible(zh)
    assert len(shown.texts) > (30 if make is page else 12)
    english = [t for t in shown.texts if LATIN.search(without_kept(t))]
    assert english == []
    # nor an English string of the table anywhere a reader sees it
    for column in STRINGS.values():
        en = without_kept(column["en"]).strip()
        if len(en) > 2 and LATIN.search(en):
            assert all(en not in t for t in shown.texts), en


@pytest.mark.parametrize("make", [page, atlas_page], ids=["page", "atlas"])
def test_the_english_page_shows_only_the_tables_strings(make):
    """A string written into the HTML instead of the table would stay English on the Chinese page."""
    en = make("en")
    assert '<html lang="en">' in en
    table = {column["en"] for column in STRINGS.values()} | set(KEPT) | {"中文"}
    assert [t for t in visible(en).texts if LATIN.search(t) and t not in table] == []


def test_the_script_shows_no_literal_text():
    """What the script writes where a reader sees it (textContent, text, alt, title, placeholder,
    aria-label) is never a literal with words in it: the words come through t()."""
    script = visible(PAGE).script + visible(ATLAS_PAGE).script
    sinks = re.findall(
        r"""(?:textContent\s*=|\btext:|\balt:|\.title\s*=|\btitle:|\.placeholder\s*=|\bplaceholder:|"aria-label":)"""
        r"""\s*(["'`])((?:\\.|(?!\1).)*)\1""",
        script,
    )
    assert sinks, "the pattern finds the literals it should"
    worded = [text for _, text in sinks if LATIN.search(re.sub(r"\$\{[^}]*\}", "", text))]
    assert worded == []


def test_the_table_reaches_the_script_as_json():
    zh = page("zh")
    assert "const STRINGS = {" in zh and STRINGS["captioning"]["zh"] in zh
    assert STRINGS["captioning"]["en"] not in zh


@pytest.mark.parametrize(
    ("asked", "fixed", "header", "want"),
    [
        (None, None, "zh-CN,zh;q=0.9,en;q=0.8", "zh"),
        (None, None, "en-US,en;q=0.9,zh;q=0.8", "en"),
        (None, None, "fr-FR,fr;q=0.9,zh-TW;q=0.7,en;q=0.5", "zh"),
        (None, None, "de", "en"),
        (None, None, "zh;q=0, en", "en"),
        (None, None, "", "en"),
        (None, None, None, "en"),
        (None, "zh", "en-US", "zh"),
        (None, "en", "zh-CN", "en"),
        ("zh", "en", "en-US", "zh"),
        ("xx", None, "zh-CN", "zh"),
    ],
)
def test_choose_language(asked, fixed, header, want):
    assert choose_language(asked, fixed, header) == want


def test_an_unknown_language_is_a_one_line_error():
    out = subprocess.run(
        [sys.executable, "-m", "captioning.cli", "serve", "--checkpoint", "x.ckpt", "--lang", "xx"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "--lang" in lines[0] and "'xx'" in lines[0] and "zh" in lines[0]
    with pytest.raises(ValueError, match="expected one of en, zh"):
        page("xx")


# ---------------------------------------------------------------------- served
pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install -e '.[web]'")


def get_page(url: str, path: str = "/", **headers) -> tuple[str, dict]:
    from tests.helpers import _connection

    conn = _connection(url, 10)
    try:
        conn.request("GET", path, headers={k.replace("_", "-"): v for k, v in headers.items()})
        response = conn.getresponse()
        assert response.status == 200
        return response.read().decode("utf-8"), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def html_lang(text: str) -> str:
    return re.search(r'<html lang="([^"]+)">', text).group(1)


def test_the_server_answers_the_browsers_language(served):
    from tests.helpers import FakeCaptioner

    server = served(FakeCaptioner())
    zh, headers = get_page(server.url, Accept_Language="zh-CN,zh;q=0.9,en;q=0.8")
    assert html_lang(zh) == "zh-CN" and headers["content-language"] == "zh-CN"
    assert headers["vary"] == "Accept-Language"  # a cache keeps one copy per language
    en, headers = get_page(server.url, Accept_Language="en-GB,en;q=0.9")
    assert html_lang(en) == "en" and headers["content-language"] == "en"
    assert html_lang(get_page(server.url)[0]) == "en"  # no header: English
    assert html_lang(get_page(server.url, "/?lang=zh", Accept_Language="en")[0]) == "zh-CN"  # the page's link


def test_serve_lang_fixes_the_language(served):
    from tests.helpers import FakeCaptioner

    server = served(FakeCaptioner(), lang="zh")
    text, headers = get_page(server.url, Accept_Language="en-US,en;q=0.9")
    assert html_lang(text) == "zh-CN" and "vary" not in headers
    assert html_lang(get_page(server.url, "/?lang=en")[0]) == "en"  # the reader can still switch
