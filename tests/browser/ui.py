"""Small helpers over Selenium for the dashboard's pages."""
from __future__ import annotations

import os
import pathlib

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: where screenshots go: build/ by default, so a test run leaves the tree clean;
#: `GPUJOBS_SCREENSHOTS=docs make test` refreshes the ones the README shows
SHOTS = ROOT / os.environ.get("GPUJOBS_SCREENSHOTS", "build/screenshots")


def wait(driver, timeout: float = 30) -> WebDriverWait:
    return WebDriverWait(driver, timeout, poll_frequency=0.1)


def find(driver, css: str, timeout: float = 30):
    return wait(driver, timeout).until(EC.visibility_of_element_located((By.CSS_SELECTOR, css)))


def present(driver, css: str, timeout: float = 30):
    return wait(driver, timeout).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))


def text_in(driver, css: str, text: str, timeout: float = 30) -> str:
    wait(driver, timeout).until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    return driver.find_element(By.CSS_SELECTOR, css).text


def sign_in(driver, url: str, token: str) -> None:
    driver.get(url)
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    field = find(driver, "#token")
    field.send_keys(token)
    field.submit()
    present(driver, "#jobs-body")


def screenshot(driver, name: str) -> pathlib.Path:
    """A PNG of the page (viewport-sized, to keep it small)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    return path


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
