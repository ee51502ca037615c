"""Headless Chromium for the browser tests (the web chat, the token viewer): one driver per test module."""

import os
import shutil

import pytest

BROWSER_INSTALL = "sudo apt-get install chromium chromium-driver"


def headless_chromium(what: str, window: str):
    """Yield a selenium driver for Debian's Chromium. Missing, it skips on a developer's machine (naming the install
    command) and fails under CI (CI=true), whose .ci/run installs it: there a missing browser is a broken set-up."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"the {what} test needs Chromium and its driver, which .ci/run installs: {BROWSER_INSTALL}")
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
