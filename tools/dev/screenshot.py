"""A screenshot of the page in headless Chromium (how assets/web_demo.png was made).

    python -m tools.dev.screenshot --url http://127.0.0.1:7860 --example 1 --word 3 --out assets/web_demo.png

Opens the page, picks an example image (or uploads ``--image``), waits for every served model's
caption and GIF, clicks the ``--word``-th word of each caption and saves the screenshot. Needs
Chromium and chromedriver (``make browser-setup``) and selenium (the web extra).
"""

from __future__ import annotations

import argparse
import shutil
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.dev.screenshot", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--out", required=True)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--example", type=int, default=0, help="the i-th example image of the page")
    source.add_argument("--image", default=None, help="upload this file instead")
    p.add_argument("--word", type=int, default=0, help="the word whose map to show")
    p.add_argument("--size", default="1400,1000", help="window width,height")
    p.add_argument("--timeout", type=float, default=120)
    args = p.parse_args(argv)

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    binary = next((b for b in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if b), None)
    driver_path = shutil.which("chromedriver")
    if not binary or not driver_path:
        print("error: Chromium and chromedriver are needed: make browser-setup", file=sys.stderr)
        return 1
    options = Options()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={args.size}",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    wait = WebDriverWait(driver, args.timeout, poll_frequency=0.1)
    try:
        driver.get(args.url)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        if args.image:
            driver.find_element(By.ID, "file-input").send_keys(args.image)
        else:
            driver.find_elements(By.CSS_SELECTOR, "#examples img")[args.example].click()
        cards = driver.find_elements(By.CSS_SELECTOR, ".card")
        for card in cards:
            wait.until(
                lambda d: (
                    card.find_element(By.CSS_SELECTOR, ".caption-text").text.strip()
                    or card.find_element(By.CSS_SELECTOR, ".error").text
                )
            )
            gif = card.find_element(By.CSS_SELECTOR, "img.gif")
            wait.until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", gif))
            words = card.find_elements(By.CSS_SELECTOR, "button.word")
            if words:
                words[min(args.word, len(words) - 1)].click()
        driver.save_screenshot(args.out)
    finally:
        driver.quit()
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
