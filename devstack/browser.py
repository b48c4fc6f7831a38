"""Headless Chromium for the dashboard (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium): the flags, the driver, the page
helpers and the synthetic wide job both the browser tests (tests/browser) and
the dashboard benchmark (bench/dashboard.py) use against the local stack
(devstack/stack.py)."""
from __future__ import annotations

import shutil
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900", "--force-device-scale-factor=1",
         "--lang=en-GB"]


def start_chrome(profile: str, *, browser_log: bool = False) -> tuple[webdriver.Chrome, Service]:
    """Headless Chromium with its own profile directory ``profile``; with
    ``browser_log`` the console is kept for ``driver.get_log("browser")``.
    The caller stops both: ``driver.quit()``, then ``service.stop()``."""
    if not (CHROMIUM and CHROMEDRIVER):
        raise RuntimeError("chromium and chromedriver are needed (make browser)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    if browser_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER)
    try:
        return webdriver.Chrome(service=service, options=options), service
    except BaseException:
        service.stop()
        raise


def wait(driver, timeout: float = 30) -> WebDriverWait:
    return WebDriverWait(driver, timeout, poll_frequency=0.1)


def find(driver, css: str, timeout: float = 30):
    return wait(driver, timeout).until(EC.visibility_of_element_located((By.CSS_SELECTOR, css)))


def present(driver, css: str, timeout: float = 30):
    return wait(driver, timeout).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))


def sign_in(driver, url: str, token: str) -> None:
    """Sign in to the dashboard at ``url`` (sessionStorage holds the token)."""
    driver.get(url)
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    field = find(driver, "#token")
    field.send_keys(token)
    field.submit()
    present(driver, "#jobs-body")


def wide_job(ranks: int = 16384, per_node: int = 256) -> tuple[dict, dict]:
    """A RUNNING job of 16,384 ranks on 64 nodes, in the API's shapes, with
    every status issue 11 adds, one first-stalled rank, co-first ranks, a
    suspect node and a verdict by silence naming the first-stalled rank. (A real gang this wide stayed PENDING on the local stack
    when tried, probably because its attempt's placement map passes
    DynamoDB's 400 KB item limit; so the page is fed this instead.)"""
    first, co, suspect = 9000, [9001, 9003], "node-35"
    view: list[dict[str, Any]] = []
    for r in range(ranks):
        node = f"node-{r // per_node:02d}"
        silence = (r * 7919 % 1000) / 100  # 0 to 10 s, scattered
        rank = {"rank": r, "node_id": node, "last_heard_at": "2026-01-01T00:00:00.000Z",
                "silence_s": silence, "step": 1000 + r % 13, "stalled": False, "paused": False}
        if node == suspect:
            rank.update(silence_s=30 + r % 5, stalled=True, status="stalled")
        if r == first:
            rank.update(silence_s=60.0)
        elif r in co:
            rank.update(silence_s=59.5)
        elif r % 997 == 0:
            rank.update(status="paused", paused=True)
        elif r % 1009 == 0:
            rank.update(status="busy")
        elif 12800 <= r < 13056:
            rank.update(status="exited")
        view.append(rank)
    view.sort(key=lambda x: (-x["silence_s"], x["rank"]))
    job: dict[str, Any] = {"id": "job_WIDE16384", "name": "wide-16384", "state": "RUNNING", "attempt": 1,
           "spec": {"ranks": ranks, "gpus_per_rank": 1, "command": ["train"], "labels": {}},
           "health": {"status": "STALLED", "threshold_s": 12.0, "first_stalled_rank": first,
                      "co_first": [{"rank": r} for r in co], "suspect_node": suspect,
                      "stalled_ranks": sorted(x["rank"] for x in view if x["stalled"]),
                      "detected_at": "2026-01-01T00:01:00.000Z",
                      "verdict": {"rank": first, "ranks": [first], "node_id": suspect,
                                  "by": "silence", "confidence": "low", "stack": None,
                                  "text": f"rank {first} on {suspect} went quiet first, 0.5 s "
                                          f"before ranks {co[0]}, {co[1]}",
                                  "evidence": {}}}}
    return job, {"attempt": 1, "threshold_s": 12.0, "now": "2026-01-01T00:01:00.000Z",
                 "ranks": view, "verdict": job["health"]["verdict"]}
