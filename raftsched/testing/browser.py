"""Headless Chromium for the web UI's test and screenshots, driven by selenium.

Chromium and chromedriver come from the Debian packages `chromium` and
`chromium-driver` (scripts/_venv.sh installs them for ./scripts/test). selenium
is a dev dependency, so it is imported only when a driver is asked for.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

# What the test and scripts/ui_screenshot.py need on PATH.
BROWSER_BINARIES = ("chromium", "chromedriver")
# Wide enough for the runs table; tall enough for a job page's first screen.
WINDOW_SIZE = (1360, 1500)
# Where screenshots taken by tests go (gitignored).
ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "test-artifacts"


def missing_browser() -> str | None:
    """None when Chromium and chromedriver are installed, else what to install."""
    missing = [name for name in BROWSER_BINARIES if shutil.which(name) is None]
    if not missing:
        return None
    return (f"{' and '.join(missing)} not found: install the Debian packages chromium and "
            f"chromium-driver (./scripts/test does)")


def chromium_driver() -> Any:
    """A headless Chromium session. The caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    # --no-sandbox: containers often run as root, where Chromium's sandbox
    # refuses to start; --disable-dev-shm-usage: /dev/shm is small there.
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}"):
        options.add_argument(flag)
    # The page's console, so a test can fail on a JavaScript error.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
    return webdriver.Chrome(service=service, options=options)
