"""Headless Chromium for the browser tests (the web chat, the token viewer): one driver per test module."""

import shutil

import pytest

BROWSER_INSTALL = "sudo apt-get install chromium chromium-driver"


def headless_chromium(what: str, window: str):
    """Yield a selenium driver for Debian's Chromium; skip (naming the install command) only when it is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip(f"the {what} test needs Chromium and its driver: {BROWSER_INSTALL}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={window}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()
