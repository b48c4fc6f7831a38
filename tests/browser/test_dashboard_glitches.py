"""The dashboard's glitches of issue 29, item 6, as a person sees them in
headless Chromium against the local stack: what shows before and after
sign-in, counts that read as English, a job page for a job that is not
there, sentences instead of JSON, and the jobs list's duration, GPUs and
reason columns."""
from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.browser import ui
from tests.browser.conftest import TENANT_TOKEN


def _signed_out(chrome, url: str) -> None:
    chrome.get(url + "/#/login")
    chrome.execute_script("sessionStorage.clear()")
    chrome.refresh()
    ui.find(chrome, "#token")


def test_sign_out_shows_only_while_signed_in(chrome, browser_stack):
    _signed_out(chrome, browser_stack.api)
    signout = chrome.find_element(By.ID, "signout")
    assert not signout.is_displayed(), "Sign out shows on the sign-in form"
    chrome.find_element(By.ID, "token").send_keys(TENANT_TOKEN + Keys.ENTER)
    ui.present(chrome, "#jobs-body")
    ui.wait(chrome).until(lambda d: signout.is_displayed())
    assert signout.text == "Sign out"
    signout.click()
    ui.find(chrome, "#token")
    assert not signout.is_displayed()
