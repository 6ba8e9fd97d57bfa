"""Headless Chromium for the browser tests: Debian's chromium and chromedriver driven by Selenium,
with a private profile and no background traffic (nothing is fetched but the pages under test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.needs import missing

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic")


def start_chromium(profile: Path, *flags: str) -> Any:
    """A Selenium driver for a fresh headless Chromium (skips the test without Debian's packages).
    The caller quits it."""
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        missing(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER})")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, *flags, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))


def console(driver: Any, last: int = 30) -> str:
    """The browser console's last entries, to read a failure by (never the failure itself)."""
    try:
        return "\n".join(str(entry) for entry in driver.get_log("browser")[-last:])
    except Exception as exc:
        return f"(no browser log: {exc})"
