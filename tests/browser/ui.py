"""Small helpers over Selenium for the dashboard's pages (the ones bench/
shares live in devstack/browser.py)."""
from __future__ import annotations

import contextlib
import os
import pathlib

from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.wait import WebDriverWait

from devstack.browser import find, present, sign_in, wait

__all__ = ["console_errors", "fetched", "find", "in_view", "never", "on_every_document", "present",
           "read", "screenshot", "sign_in", "text_in", "time_zone", "viewport", "wait", "watch_fetches"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: where screenshots go: build/ by default, so a test run leaves the tree clean;
#: `GPUJOBS_SCREENSHOTS=docs make test` refreshes the ones the README shows
SHOTS = ROOT / os.environ.get("GPUJOBS_SCREENSHOTS", "build/screenshots")


def text_in(driver, css: str, text: str, timeout: float = 30) -> str:
    wait(driver, timeout).until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    return driver.find_element(By.CSS_SELECTOR, css).text


def read(driver, what, timeout: float = 30):
    """``what(driver)``, read whole from one drawing of the page: read again
    when the page drew anew meanwhile (its refresh replaces the elements, and
    an element found before it is stale), however slow the machine."""
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)) \
        .until(lambda d: (what(d),))[0]


def screenshot(driver, name: str) -> pathlib.Path:
    """A PNG of the page (viewport-sized, to keep it small)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    return path


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@contextlib.contextmanager
def on_every_document(driver, source: str):
    """Run ``source`` first in every document the driver opens from now on
    (not in the one open now: open or refresh a page after entering)."""
    script = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})
    try:
        yield
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                               {"identifier": script["identifier"]})


def watch_fetches(driver) -> None:
    """Record the URL of every fetch the open document makes from now on."""
    driver.execute_script("""
        if (!window.__fetched) {
          window.__fetched = [];
          const real = window.fetch;
          window.fetch = (url, opts) => { window.__fetched.push(String(url)); return real(url, opts); };
        }""")


def fetched(driver, part: str = "") -> list[str]:
    """The URLs fetched since watch_fetches() that contain ``part``."""
    return [u for u in driver.execute_script("return window.__fetched || []") if part in u]


def never(driver, condition, seconds: float, what: str = "") -> None:
    """Fail if ``condition(driver)`` comes true within ``seconds`` (polled): for
    what must not happen."""
    try:
        wait(driver, seconds).until(condition)
    except TimeoutException:
        return
    raise AssertionError(f"it happened: {what or condition}")


@contextlib.contextmanager
def viewport(driver, width: int = 1280, height: int = 800):
    """The page's viewport is ``width`` x ``height`` CSS pixels (a laptop's
    screen) while inside; the session's own size after."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        yield
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@contextlib.contextmanager
def time_zone(driver, zone: str):
    """The browser's local time zone is ``zone`` (e.g. America/New_York) while inside."""
    driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": zone})
    try:
        yield
    finally:
        driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})


def in_view(driver, element) -> dict:
    """Where ``element`` is against the viewport: its box, whether all of it is
    inside the viewport, and whether the page scrolls sideways."""
    return driver.execute_script("""
        const r = arguments[0].getBoundingClientRect(), de = document.documentElement;
        return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                width: de.clientWidth, height: de.clientHeight,
                inside: r.width > 0 && r.left >= 0 && r.top >= 0 && r.right <= de.clientWidth
                        && r.bottom <= de.clientHeight,
                sideways: de.scrollWidth > de.clientWidth};""", element)
