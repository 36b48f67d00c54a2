"""The inspector in a real browser: ``episodic serve`` as a subprocess on PostgreSQL, headless
Chromium (Debian's chromium and chromium-driver) signing in through the form with an operator
key made by ``episodic keys create --operator``, opening a compacted conversation and finding
its boundary, handoff summary and token figures. A full-page screenshot goes to
``$EPISODIC_TEST_ARTIFACTS`` (default: ``artifacts/`` at the repository's root)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from episodic import EpisodicStore, Message
from tests.acceptance.test_cli import clean_env, run_cli
from tests.conftest import isolated_settings
from tests.server.live import serving
from tests.server.test_inspector import SUMMARY, Compacted, compacted_conversation
from tests.support import REQUIRE_EXTRAS, require_extra

pytestmark = pytest.mark.postgres_only

ROOT = Path(__file__).resolve().parents[2]
#: Read at import: the tests' environment is scrubbed of EPISODIC_* variables.
ARTIFACTS = Path(os.environ.get("EPISODIC_TEST_ARTIFACTS") or ROOT / "artifacts")
#: Debian's chromium and chromium-driver, wherever PATH finds them
CHROMIUM = Path(shutil.which("chromium") or "/usr/bin/chromium")
CHROMEDRIVER = Path(shutil.which("chromedriver") or "/usr/bin/chromedriver")
WINDOW = (1280, 1600)


def _require_browser() -> None:
    """Skip without Chromium and its driver (apt-get install chromium chromium-driver), or
    fail where CI requires every extra."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        message = f"needs {', '.join(missing)}: apt-get install chromium chromium-driver"
        if REQUIRE_EXTRAS:
            pytest.fail(f"{message}; EPISODIC_TEST_REQUIRE_EXTRAS=1", pytrace=False)
        pytest.skip(message, allow_module_level=True)


webdriver = require_extra("selenium.webdriver", "dev")
_require_browser()
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402


@pytest.fixture
def chromium() -> Iterator[Any]:
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.set_window_size(*WINDOW)
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def server(postgres_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``episodic serve`` on a free port: its base URL and an operator key of tenant acme."""
    env = clean_env(EPISODIC_DATABASE_URL=postgres_url)
    created = run_cli(
        "keys", "create", "--tenant", "acme", "--operator", "--label", "ui", cwd=tmp_path, env=env
    )
    assert created.code == 0, created.output
    with serving(tmp_path, env) as served:
        yield served.base, created.stdout.strip()


def _navigate(driver: Any, element: Any) -> None:
    """Click ``element`` and wait for the page it leads to: a click returns before a form's
    POST and its redirect have loaded the next page."""
    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 15).until(expected_conditions.staleness_of(page))
    WebDriverWait(driver, 15).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def _full_page_screenshot(driver: Any, path: Path) -> None:
    """The whole page, not just the window: Chromium's DevTools capture beyond the
    viewport."""
    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {
                "x": 0,
                "y": 0,
                "width": max(size["width"], WINDOW[0]),
                "height": size["height"],
                "scale": 1,
            },
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))


async def _fill(url: str) -> Compacted:
    """A compacted conversation of tenant acme (and a short one beside it)."""
    store = await EpisodicStore.open(url, settings=isolated_settings())
    try:
        acme = store.for_tenant("acme")
        made = await compacted_conversation(acme)
        other = await acme.create_conversation(app_name="support-bot", user_id="u-42")
        await acme.append(
            other, [Message.user("where is my order?"), Message.assistant("On its way.")]
        )
        return made
    finally:
        await store.close()


def test_an_operator_inspects_a_compacted_conversation(
    postgres_url: str, server: tuple[str, str], chromium: Any
) -> None:
    base, secret = server
    made = asyncio.run(_fill(postgres_url))
    driver = chromium

    driver.get(f"{base}/ui/conversations/{made.conversation_id}")
    assert "Sign in to the inspector" in driver.page_source
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _full_page_screenshot(driver, ARTIFACTS / "inspector-sign-in.png")
    driver.find_element(By.NAME, "key").send_keys(secret)
    _navigate(driver, driver.find_element(By.CSS_SELECTOR, "button[type=submit].primary"))
    # back where it started, signed in (the form's next)
    assert driver.current_url == f"{base}/ui/conversations/{made.conversation_id}"
    cookie = driver.get_cookie("episodic_ui_key")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui"
    assert driver.execute_script("return document.cookie") == ""  # HttpOnly: no script reads it

    handoff = driver.find_element(By.CSS_SELECTOR, "[data-testid=handoff]")
    assert "handoff summary" in handoff.text
    assert SUMMARY in handoff.text
    boundary = driver.find_element(By.CSS_SELECTOR, "[data-testid=boundary]")
    assert "Summary boundary" in boundary.text
    assert SUMMARY in boundary.text
    before = driver.find_element(By.CSS_SELECTOR, "[data-testid=tokens-before]").text
    after = driver.find_element(By.CSS_SELECTOR, "[data-testid=tokens-after]").text
    assert before == f"{made.tokens_before:,}"
    assert after == f"{made.tokens_after:,}"
    retracted = driver.find_element(By.CSS_SELECTOR, "[data-testid=retracted] pre")
    assert retracted.value_of_css_property("text-decoration-line") == "line-through"
    assert (
        "upstream said 503" in driver.find_element(By.CSS_SELECTOR, "[data-testid=attempts]").text
    )

    shot = ARTIFACTS / "inspector-conversation.png"
    _full_page_screenshot(driver, shot)
    assert shot.stat().st_size > 10_000
    print(f"\nscreenshot: {shot}")
    dark = {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", dark)
    _full_page_screenshot(driver, ARTIFACTS / "inspector-conversation-dark.png")
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    _navigate(driver, driver.find_element(By.LINK_TEXT, "Conversations"))
    assert str(made.conversation_id) in driver.page_source
    listing = ARTIFACTS / "inspector-conversations.png"
    _full_page_screenshot(driver, listing)
    print(f"screenshot: {listing}")
    _navigate(driver, driver.find_element(By.XPATH, "//button[text()='Sign out']"))
    assert "Sign in to the inspector" in driver.page_source
    assert driver.get_cookie("episodic_ui_key") is None
