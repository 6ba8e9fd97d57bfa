"""The browser pages against a server with an API key (docs/security.md), in headless Chromium: the
call page asks for the key, trades it for a one-use session token and opens /ws with it; /qa shows
a login form whose key becomes a cookie that opens the dashboard and its API calls."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chromium import console, start_chromium
from tests.e2e.conftest import Server, start_server, stop_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

KEY = "e2e-browser-key-7f3a9c"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server, proc = start_server(tmp_path_factory.mktemp("keyed"),
                                env={"VOICE_AGENT_SERVER__API_KEYS": json.dumps([KEY])})
    try:
        yield server
    finally:
        stop_server(proc)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    driver = start_chromium(tmp_path / "chromium-profile", "--use-fake-ui-for-media-stream",
                            "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required")
    try:
        yield driver
    finally:
        driver.quit()


def _wait(what: str, check: Any, driver: Any, server: Server, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what}\nbrowser console:\n{console(driver)}\nserver log:\n{server.log()[-3000:]}")


def test_the_call_page_asks_for_the_key_and_connects_with_a_token(keyed_server: Server, browser: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    browser.get(keyed_server.base_url + "/")
    browser.find_element(By.ID, "start").click()

    def prompt() -> Any:
        try:
            return browser.switch_to.alert
        except NoAlertPresentException:
            return None

    alert = _wait("the page did not ask for a key", prompt, browser, keyed_server)
    assert "API key" in alert.text
    alert.send_keys(KEY)
    alert.accept()
    _wait("the page did not start a session with the key",
          lambda: "session.started" in browser.execute_script("return window.voiceAgent.events.map(e => e.type)"),
          browser, keyed_server)
    assert browser.execute_script("return sessionStorage.getItem('voice-agent-key')") == KEY
    browser.find_element(By.ID, "stop").click()
    _wait("the page did not close after Stop",
          lambda: browser.execute_script("return window.voiceAgent.state") == "closed", browser, keyed_server)
    assert KEY not in keyed_server.log()


def test_qa_shows_a_login_form_whose_cookie_opens_the_dashboard(keyed_server: Server, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(keyed_server.base_url + "/qa")
    assert browser.find_element(By.ID, "key").get_attribute("type") == "password"
    auth = "return fetch('/api/auth').then(r => r.json())"
    assert browser.execute_script(auth) == {"keys_required": True, "authorized": False}
    browser.find_element(By.ID, "key").send_keys("not-the-key")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    _wait("a wrong key was not refused", lambda: browser.find_element(By.ID, "error").text, browser, keyed_server)

    key = browser.find_element(By.ID, "key")
    key.clear()
    key.send_keys(KEY)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    _wait("the dashboard did not load after the login",
          lambda: not browser.find_elements(By.ID, "login"), browser, keyed_server)
    assert browser.execute_script(auth) == {"keys_required": True, "authorized": True}
    status = "return fetch('/api/calls').then(r => r.status)"
    assert browser.execute_script(status) == 200  # the dashboard's same-origin fetch() is in, by the cookie
    assert browser.execute_script("return fetch('/v1/models').then(r => r.status)") == 401  # a key only
    assert "voice_agent_login" not in browser.execute_script("return document.cookie")  # HttpOnly
