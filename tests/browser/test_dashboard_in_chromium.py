"""The dashboard and Swagger UI in a real headless Chromium (Debian's chromium and chromium-driver)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import Actor
from tests.live import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium and chromium-driver must be installed (see .ci/apt-packages.txt)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="svc-chromium-")
    # Offline machine: no background fetches, no first-run, no sandbox as root.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _sign_in(browser: webdriver.Chrome, live: LiveServer, actor: Actor) -> None:
    browser.get(f"{live.url}/login/")
    browser.find_element(By.NAME, "token").send_keys(actor.token)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(browser, 15).until(expected_conditions.url_to_be(f"{live.url}/"))


def test_sign_in_and_create_a_token(browser: webdriver.Chrome, live: LiveServer, owner: Actor) -> None:
    _sign_in(browser, live, owner)
    assert "acme" in browser.find_element(By.TAG_NAME, "h1").text
    nav = [link.text for link in browser.find_elements(By.CSS_SELECTOR, ".topbar nav a")]
    assert "Access tokens" in nav and "Sandboxes" in nav and "Skills" in nav
    browser.get(f"{live.url}/tokens/")
    browser.find_element(By.NAME, "name").send_keys("from the browser")
    browser.find_element(By.XPATH, "//button[text()='Create token']").click()
    secret = WebDriverWait(browser, 15).until(expected_conditions.presence_of_element_located((By.ID, "new-token")))
    assert secret.text.startswith("svc_pat_")
    assert "from the browser" in browser.find_element(By.CSS_SELECTOR, "table.list").text


def test_swagger_ui_renders_the_schema(browser: webdriver.Chrome, live: LiveServer, owner: Actor) -> None:
    _sign_in(browser, live, owner)
    browser.get(f"{live.url}/api/docs")
    title = WebDriverWait(browser, 30).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .info .title"))
    )
    assert "svc API" in title.text
    operations: list[WebElement] = WebDriverWait(browser, 30).until(
        lambda b: b.find_elements(By.CSS_SELECTOR, ".opblock-summary-path") or False
    )
    paths = {op.text.replace("\u200b", "") for op in operations}
    assert "/api/v1/me" in paths and "/api/v1/sandboxes" in paths
