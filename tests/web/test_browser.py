"""The web page in a real browser: headless Chromium (Debian's package) driven by Selenium.

It uploads an image, sees the caption and the attention GIF appear for a soft and a hard model,
clicks a word and sees its map, drags a focus box over the image and sees the focused caption,
checks that the page's bicubic stretch of a map is the one the Python overlays use, and saves a
screenshot. Chromium and chromedriver come from Debian:
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
    proc.checkpoints = {"soft": soft, "hard": hard}
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


def test_drag_a_box_and_see_the_focused_caption(browser, page_server, tiny_shapes, tmp_path):
    """A box dragged over the shown image reaches the API in the image's own pixels (the preview
    is shown smaller), with the strength field; the card shows the Captioner's focused caption,
    its maps inside the box and the box drawn; clearing it gives the plain caption back."""
    import json

    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    from captioning.api import Captioner
    from captioning.decoding.steering import cell_coverage

    data = json.loads(tiny_shapes.read_text())
    image = next(i for i in data["images"] if i["split"] == "test" and len(i["objects"]) >= 2)
    photo = tmp_path / "two.jpg"
    photo.write_bytes(jpeg_640x480(tiny_shapes.parent / image["filepath"] / image["filename"]))

    browser.get(page_server.url)
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "no page")
    browser.find_element(By.ID, "file-input").send_keys(str(photo))
    soft = card(browser, "soft")
    status = soft.find_element(By.CSS_SELECTOR, ".status")
    wait(browser, lambda d: "answered" in status.text, "no plain caption")
    plain = soft.find_element(By.CSS_SELECTOR, ".caption-text").text
    browser.find_element(By.ID, "focus-strength").send_keys("1000")

    preview = browser.find_element(By.ID, "preview")
    rect = browser.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height, arguments[0].naturalWidth]", preview
    )
    assert rect[2] == 640 and rect[0] < 640, rect  # shown smaller than the image: the scale matters
    width, height = rect[0], rect[1]
    # drag over the left half's upper part: from (5%, 10%) to (45%, 60%) of the shown image
    start = (round(0.05 * width), round(0.10 * height))
    end = (round(0.45 * width), round(0.60 * height))
    chain = ActionChains(browser)
    chain.move_to_element_with_offset(preview, start[0] - width / 2, start[1] - height / 2).click_and_hold()
    chain.move_by_offset((end[0] - start[0]) // 2, (end[1] - start[1]) // 2)
    chain.move_by_offset(end[0] - start[0] - (end[0] - start[0]) // 2, end[1] - start[1] - (end[1] - start[1]) // 2)
    chain.release().perform()

    wait(browser, lambda d: soft.get_attribute("data-focus"), "no focused answer")
    wait(browser, lambda d: "focused on" in status.text, "the focused answer was not shown")
    box = [float(v) for v in soft.get_attribute("data-focus").split(",")]
    scale = 640 / width
    want_box = [start[0] * scale, start[1] * scale, end[0] * scale, end[1] * scale]
    assert all(abs(a - b) <= 2 * scale for a, b in zip(box, want_box)), (box, want_box)
    assert browser.find_element(By.ID, "focus-box").is_displayed()
    assert browser.find_element(By.ID, "focus-area").get_attribute("data-focus") == soft.get_attribute("data-focus")
    assert "strength 1000" in status.text

    captioner = Captioner.from_checkpoint(page_server.checkpoints["soft"], device="cpu")
    [want] = captioner([str(photo)], return_attention=True, num_beams=3, focus=box, focus_strength=1000)
    assert soft.find_element(By.CSS_SELECTOR, ".caption-text").text == want["generated_text"]
    attention = np.array(browser.execute_script("return state.cards.soft.result.attention"))
    gh, gw = attention.shape[1:]
    inside = cell_coverage(box, 640, 480, gh, gw).view(gh, gw).numpy() > 0
    assert attention[:, inside].sum(-1).min() > 0.99  # every word's map in the box

    # clearing the box asks again without a focus
    browser.find_element(By.ID, "focus-clear").click()
    wait(browser, lambda d: not soft.get_attribute("data-focus") and "focused on" not in status.text, "not cleared")
    assert soft.find_element(By.CSS_SELECTOR, ".caption-text").text == plain
    assert not browser.find_element(By.ID, "focus-box").is_displayed()


def test_the_chinese_page(browser, page_server, tiny_shapes, tmp_path):
    """The page at ?lang=zh, after a caption: every word a reader sees is Chinese, a name the page keeps
    (captioning/web/page.py: KEPT), the API's own text (captions, model names and descriptions) or the
    upload's file name."""
    import json
    import re

    from selenium.webdriver.common.by import By

    from captioning.web.client import caption
    from captioning.web.page import KEPT
    from tests.helpers import get_json

    src = sorted((tiny_shapes.parent / "images" / "test").glob("*.png"))[1]
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(jpeg_640x480(src))
    browser.get(page_server.url + "/?lang=zh")
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1", "no page")
    assert browser.find_element(By.TAG_NAME, "html").get_attribute("lang") == "zh-CN"
    browser.find_element(By.ID, "file-input").send_keys(str(photo))
    for name in ("soft", "hard"):
        status = card(browser, name).find_element(By.CSS_SELECTOR, ".status")
        wait(browser, lambda d, s=status: "秒内返回" in s.text, f"no Chinese status line for {name}")
    card(browser, "hard").find_elements(By.CSS_SELECTOR, "button.word")[0].click()
    shown = browser.find_element(By.TAG_NAME, "body").text
    # what the API says, as the page got it: the models' descriptions and the captions of the same upload
    _, models = get_json(page_server.url, "/api/models")
    answers = [caption(photo, url=page_server.url, model=name, num_beams=3) for name in ("soft", "hard")]
    api_words = set(re.findall(r"[A-Za-z_]\w*", json.dumps([models, answers, photo.name])))  # and the file's name
    for name in KEPT:
        shown = shown.replace(name, "")
    left = [w for w in re.findall(r"[A-Za-z_]\w*", shown) if w not in api_words]
    assert left == [], shown
    assert "第" in card(browser, "hard").find_element(By.CSS_SELECTOR, "figcaption").text  # 第 r 行，第 c 列
