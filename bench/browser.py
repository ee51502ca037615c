"""Headless Chromium for the screenshot scripts (bench/screenshot_*.py)."""

from __future__ import annotations

import shutil


def open_browser(window: str):
    """A selenium driver for Debian's Chromium at `window` ("960,720"); exits with the install command when missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium") or shutil.which("google-chrome"), shutil.which("chromedriver")
    if not chromium or not driver:
        raise SystemExit("needs Chromium and its driver: sudo apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={window}", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)
