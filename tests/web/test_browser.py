"""The web page in a real browser: headless Chromium (Debian's package) driven by Selenium.

It uploads an image, sees the caption and the attention GIF appear for a soft and a hard model,
clicks a word and sees its map, checks that the page's bicubic stretch of a map is the one the
Python overlays use, and saves a screenshot. Chromium and chromedriver come from Debian:
`.ci/browser-setup` installs them (CI runs it before the tests); where they cannot be installed the
test skips and says so. CAPTIONING_WEB_SCREENSHOT=path also copies the screenshot there.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the web extra is not installed: pip install -e '.[web]'")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install -e '.[web]'")

from tests.helpers import ServerProcess, jpeg_640x480  # noqa: E402

pytestmark = pytest.mark.browser
TIMEOUT = 60


def find_browser() -> tuple[str, str]:
    browser = os.environ.get("CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip(
            "Chromium and chromedriver are not installed: run .ci/browser-setup (as root it installs "
            "Debian's chromium and chromium-driver packages), or set CHROMIUM and CHROMEDRIVER"
        )
    return browser, driver


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = find_browser()
    options = Options()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1100",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(TIMEOUT)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page_server(tiny_shapes, tmp_path_factory):
    from captioning.training.cli import run_lightning_cli
    from tests.helpers import fit_args

    def fit(config, steps):
        root = tmp_path_factory.mktemp(f"fit_{config.split('.')[0]}_browser")
        return run_lightning_cli(
            fit_args(tiny_shapes, root, config=config, steps=steps, extra=["--trainer.max_epochs", "3"])
        ).trainer.checkpoint_callback.last_model_path

    # trained a little longer than the shared tiny checkpoint, so that its words' maps differ visibly
    soft, hard = fit("shapes_soft.yaml", 5), fit("shapes_hard.yaml", 3)
    proc = ServerProcess(
        [f"soft={soft}", f"hard={hard}"], log=tmp_path_factory.mktemp("web_browser_log") / "server.log"
    )
    yield proc
    proc.stop()


def wait(driver, condition, message):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, TIMEOUT, poll_frequency=0.1).until(lambda d: condition(d), message)


def card(driver, name):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'.card[data-model="{name}"]')


def test_upload_caption_gif_and_word_maps(browser, page_server, tiny_shapes, tmp_path):
    from selenium.webdriver.common.by import By

    src = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[0]
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(jpeg_640x480(src))

    browser.get(page_server.url)
    wait(
        browser,
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1",
        "the page did not load",
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, "#examples img")) == 8  # the training data's test images
    assert browser.find_element(By.ID, "mode-field").is_displayed()  # a hard model is served
    browser.find_element(By.ID, "file-input").send_keys(str(photo))

    for name in ("soft", "hard"):
        c = card(browser, name)
        wait(
            browser,
            lambda d, c=c: (
                c.find_element(By.CSS_SELECTOR, ".caption-text").text.strip()
                or c.find_element(By.CSS_SELECTOR, ".error").text
            ),
            f"no caption for {name}",
        )
        assert not c.find_element(By.CSS_SELECTOR, ".error").is_displayed(), c.find_element(
            By.CSS_SELECTOR, ".error"
        ).text
        gif = c.find_element(By.CSS_SELECTOR, "img.gif")
        wait(
            browser,
            lambda d, gif=gif: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", gif),
            f"no GIF for {name}",
        )
        assert gif.get_attribute("src").startswith("data:image/gif;base64,") and gif.is_displayed()
        assert "score" in c.find_element(By.CSS_SELECTOR, ".score").text
        assert c.find_element(By.CSS_SELECTOR, "table.description").text.count("small_cnn") == 1

    # click the second word of the soft model's caption: its map replaces the first word's
    c = card(browser, "soft")
    canvas = c.find_element(By.CSS_SELECTOR, "canvas.word-map")
    wait(browser, lambda d: canvas.get_attribute("data-word") == "0", "the first word's map was not drawn")
    first = browser.execute_script("return arguments[0].toDataURL()", canvas)
    words = c.find_elements(By.CSS_SELECTOR, "button.word")
    assert len(words) >= 2, "the tiny model wrote fewer than two words"
    words[1].click()
    wait(browser, lambda d: canvas.get_attribute("data-word") == "1", "clicking a word did not show its map")
    assert "active" in words[1].get_attribute("class") and "active" not in words[0].get_attribute("class")
    second = browser.execute_script("return arguments[0].toDataURL()", canvas)
    assert second != first
    assert words[1].text in c.find_element(By.CSS_SELECTOR, "figcaption").text
    # the map covers the image: its pixels vary (not a blank or flat canvas)
    spread = browser.execute_script(
        "const c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let lo = 255, hi = 0; for (let i = 0; i < d.length; i += 4) { lo = Math.min(lo, d[i]); hi = Math.max(hi, d[i]); }"
        "return [c.width, c.height, hi - lo];",
        canvas,
    )
    assert spread[0] >= 256 and spread[1] >= 192 and spread[2] > 50, spread
    # the hard model names the chosen cell of the selected word
    hard = card(browser, "hard")
    hard.find_elements(By.CSS_SELECTOR, "button.word")[0].click()
    assert "chosen cell (row" in hard.find_element(By.CSS_SELECTOR, "figcaption").text

    shot = tmp_path / "web_page.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("CAPTIONING_WEB_SCREENSHOT"):
        shutil.copy(shot, os.environ["CAPTIONING_WEB_SCREENSHOT"])


def test_page_stretches_maps_as_the_python_overlays_do(browser, page_server):
    """The page's bicubic upsampling of a grid equals captioning.viz.attention_maps.upsample_map."""
    from captioning.viz.attention_maps import upsample_map

    if not browser.current_url.startswith(page_server.url):
        browser.get(page_server.url)
    grid = np.random.default_rng(0).random((7, 5))
    for width, height in ((200, 130), (33, 64)):
        got = browser.execute_script(
            "return Array.from(upsample(arguments[0], arguments[1], arguments[2]))", grid.tolist(), width, height
        )
        np.testing.assert_allclose(np.array(got).reshape(height, width), upsample_map(grid, (width, height)), atol=1e-9)


def test_a_bad_upload_shows_its_message(browser, page_server, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(page_server.url)
    wait(
        browser,
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1",
        "the page did not load",
    )
    bad = tmp_path / "notes.jpg"
    bad.write_text("not a picture at all")
    browser.find_element(By.ID, "file-input").send_keys(str(bad))
    error = card(browser, "soft").find_element(By.CSS_SELECTOR, ".error")
    wait(browser, lambda d: error.is_displayed() and error.text, "no error message")
    assert "notes.jpg: not an image file" in error.text
