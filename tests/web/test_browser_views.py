"""The page's view selector and the atlas page in headless Chromium (as tests/web/test_browser.py):
each view is drawn by the models that have it (the matrix, the gate's bar, the window, the sampled
cell), a model without it says so and shows its maps; the atlas page draws one panel per model."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[web]'")

from captioning.api import Captioner  # noqa: E402
from captioning.web.served import ServedModel  # noqa: E402
from tests.cli.test_attend_views import tiny  # noqa: E402
from tests.web.test_browser import browser, card, wait  # noqa: E402, F401 (the browser fixture)

pytestmark = pytest.mark.browser
KINDS = ("soft", "hard", "local", "transformer")


@pytest.fixture
def page(serve_models):
    return serve_models([ServedModel(kind, Captioner.from_model(tiny(kind), device="cpu")) for kind in KINDS])


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(5).random((48, 64, 3)) * 255).astype(np.uint8)).save(path)
    return path


def ready(driver):
    from selenium.webdriver.common.by import By

    wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "not loaded")


def test_each_view_is_drawn_by_the_models_that_have_it(browser, page, photo):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(page.url)
    ready(browser)
    browser.find_element(By.ID, "file-input").send_keys(str(photo))
    has = {
        "alignment": KINDS,
        "self": ("transformer",),
        "gate": ("soft", "hard", "local"),
        "window": ("local",),
        "sample": ("hard",),
    }
    for view, models in has.items():
        Select(browser.find_element(By.ID, "view")).select_by_value(view)
        for kind in KINDS:
            c = card(browser, kind)
            note = c.find_element(By.CSS_SELECTOR, ".view-note")
            if kind in models:  # drawn once the answer with the views has come
                wait(browser, lambda d, c=c, view=view: c.get_attribute("data-view") == view, f"{kind}: no {view}")
            else:
                wait(browser, lambda d, note=note, view=view: f"no {view} view" in note.text, f"{kind}: {view} noted")
                assert c.get_attribute("data-view") == "maps"
            assert note.is_displayed() == (kind not in models)
            if kind not in models:
                assert f"this model has no {view} view" in note.text
                continue
            if view in ("alignment", "self"):
                matrix = c.find_element(By.CSS_SELECTOR, "canvas.view-matrix")
                assert matrix.is_displayed() and int(matrix.get_attribute("width")) > 100
            elif view == "gate":
                assert c.find_element(By.CSS_SELECTOR, ".gate").text.startswith("gate beta = 0.")
            elif view == "window":
                assert "window centre (" in c.find_element(By.CSS_SELECTOR, "figcaption").text
            else:
                assert c.find_element(By.CSS_SELECTOR, "figure.second canvas").is_displayed()
                assert "the cell sampled from it" in c.find_element(By.CSS_SELECTOR, "figcaption").text


def test_the_atlas_page_draws_a_panel_per_model(browser, page, photo):  # noqa: F811
    from selenium.webdriver.common.by import By

    browser.get(page.url + "/atlas")
    ready(browser)
    browser.find_element(By.ID, "file").send_keys(str(photo))
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-drawn") == "4", "no atlas")
    assert browser.find_element(By.ID, "atlas").get_attribute("src").startswith("data:image/png;base64,")
    rows = browser.find_elements(By.CSS_SELECTOR, "#panels tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == list(KINDS)
