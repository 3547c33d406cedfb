"""/docs and /console in a real headless browser (the system's chromium, driven by selenium) against
the service's real process. Skips where no chromium is installed; scripts/test.sh installs it when
it can, and under CI a missing browser fails."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import ROOT, start_api, stop

KEY = "console-test-key"
ADMIN_KEY = "console-admin-key"
SCREENSHOTS = Path(os.environ.get("SEQSERVE_SCREENSHOT_DIR", ROOT / ".test-output"))
BROWSER_PATHS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> tuple[str, str]:
    browser = next((p for name in BROWSER_PATHS if (p := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        if os.environ.get("CI"):
            pytest.fail("chromium/chromedriver not installed; scripts/test.sh installs them (apt-get install chromium)")
        pytest.skip("no chromium and chromedriver here (scripts/test.sh installs them when run as root)")
    return browser, driver


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    browser, chromedriver = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    d = webdriver.Chrome(service=Service(chromedriver), options=options)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def service(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("browser-state")
    proc, url = start_api(
        tiny_artifacts,
        env={
            "SEQSERVE_DEFAULT_MODEL": "sasrec-tiny",
            "SEQSERVE_EVENTS_API_KEY": KEY,
            "SEQSERVE_ADMIN_API_KEY": ADMIN_KEY,
            "SEQSERVE_HISTORY_PATH": str(state / "history.sqlite3"),
            "SEQSERVE_STATE_DIR": str(state),
        },
    )
    yield url
    stop(proc)


def _wait(driver: Any, condition: Any, timeout: float = 20) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A row read while the page redraws its table is gone by the time it is read: asked again.
    return WebDriverWait(driver, timeout, ignored_exceptions=[StaleElementReferenceException]).until(condition)


def _other_hosts(driver: Any, origin: str) -> list[str]:
    """Every resource the page loaded from anywhere but the service."""
    names = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [n for n in names if not n.startswith(origin)]


def test_docs_render_every_operation_offline(driver: Any, service: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{service}/docs")
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")) >= 8)
    paths = {e.text.replace("\u200b", "") for e in driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/recommend", "/next-location", "/events", "/history", "/models"} <= paths
    assert _other_hosts(driver, service) == []


def _rows(driver: Any, table: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")


def _answer_ids(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [r.find_elements(By.TAG_NAME, "td")[1].text for r in _rows(driver, "answer")]


def test_console_shows_titled_answers_and_an_event_changes_them(driver: Any, service: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(f"{service}/console")
    _wait(driver, lambda d: Select(d.find_element(By.ID, "model")).first_selected_option.text.startswith("sasrec-tiny"))
    driver.find_element(By.ID, "user").send_keys("u3")
    driver.find_element(By.ID, "api-key").send_keys(KEY)  # the history is read with the events key
    driver.find_element(By.ID, "ask").click()
    _wait(driver, lambda d: len(_rows(d, "answer")) == 10)
    before = _answer_ids(driver)
    # Ten titled items (the synthetic item table's "Item <id>"), with their genres, and the history.
    assert all(text.startswith("Item ") for text in before), before
    assert all("Genre" in r.find_elements(By.TAG_NAME, "td")[2].text for r in _rows(driver, "answer"))
    _wait(driver, lambda d: len(_rows(d, "history")) > 0 and "Item " in _rows(d, "history")[0].text)
    assert "excluded" in driver.find_element(By.ID, "excluded").text

    # The top item becomes an event of this user: seen now, it leaves the answer.
    _rows(driver, "answer")[0].find_element(By.TAG_NAME, "button").click()
    top = driver.find_element(By.ID, "event-item").get_attribute("value")
    driver.find_element(By.ID, "post-event").click()
    _wait(driver, lambda d: d.find_element(By.ID, "event-status").text.startswith("stored"))
    _wait(driver, lambda d: len(_rows(d, "answer")) == 10 and _answer_ids(d) != before)
    assert f"Item {top}" not in _answer_ids(driver)
    _wait(driver, lambda d: _rows(d, "history")[0].text.split("\n")[0].startswith(f"1 Item {top}"))
    assert "live" in _rows(driver, "history")[0].text
    # The list shown before the event is scored against it (its top item: a hit at rank 1), and drawn.
    _wait(
        driver,
        lambda d: "n 1, NDCG@10 1.0000" in d.execute_script("loadOnline(); return $('online-summary').textContent"),
    )
    # Its line and, dashed, its floor's (the version's popularity list scored on the same event).
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#online-chart path")) == 2)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#online-chart path[stroke-dasharray]")) == 1
    # u3 is a user the artifact held, the list had no item first seen live; what was shown is counted.
    # Read in one script: the polls above may leave a loadOnline() in flight that redraws the table.
    floor, cells = driver.execute_script(
        "return [...$('online-breakdown').tBodies[0].rows].map((r) => [...r.cells].map((c) => c.textContent))"
    )
    assert floor[0].endswith("/floor") and floor[6:] == ["-", "-", "-"], floor  # scored, never shown
    assert cells[0].endswith("/live") and cells[1:6] == ["1.0000 (n 1)", "-", "-", "-", "1.0000 (n 1)"], cells
    assert int(cells[6]) >= 1 and cells[7].endswith(")") and cells[8].endswith("%"), cells  # lists shown, once shared
    # The key was used, never kept by the page.
    kept = driver.execute_script("return [localStorage.length, sessionStorage.length, document.cookie]")
    assert kept == [0, 0, ""]
    assert _other_hosts(driver, service) == []
    assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOTS / "console.png"))


def test_console_says_what_is_wrong(driver: Any, service: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{service}/console")
    _wait(driver, lambda d: d.find_element(By.ID, "model").get_attribute("value"))
    driver.find_element(By.ID, "user").send_keys("nobody-here")
    driver.find_element(By.ID, "ask").click()
    # Histories are private on this service: without the key the page says so, about any user.
    error = _wait(driver, lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").text else None)
    assert "401" in error.text and "X-API-Key" in error.text
    driver.find_element(By.ID, "api-key").send_keys(KEY)
    driver.find_element(By.ID, "ask").click()
    # With the key, a user the model does not know gets the fallback's list, and the page says so.
    _wait(driver, lambda d: "does not know" in d.find_element(By.ID, "excluded").text)
    assert "popular items" in driver.find_element(By.ID, "excluded").text and len(_rows(driver, "answer")) == 10
    driver.find_element(By.ID, "filter").send_keys("{not json")
    driver.find_element(By.ID, "ask").click()
    _wait(driver, lambda d: "not JSON" in d.find_element(By.ID, "error").text)


def test_a_link_opens_a_model_and_user_with_hidden_and_similar_items(driver: Any, service: str) -> None:
    import httpx2 as httpx
    from selenium.webdriver.common.by import By

    hidden = "12"
    r = httpx.post(
        f"{service}/admin/models/sasrec-tiny/items/hide",
        json={"item_ids": [hidden], "reason": "out of stock"},
        headers={"X-API-Key": ADMIN_KEY},
    )
    assert r.status_code == 200, r.text
    driver.get(f"{service}/console?model=bert4rec-tiny&user=u5")
    _wait(driver, lambda d: d.find_element(By.ID, "user").get_attribute("value") == "u5")
    assert driver.find_element(By.ID, "model").get_attribute("value") == "bert4rec-tiny"
    driver.get(f"{service}/console?model=sasrec-tiny&user=u5")
    _wait(driver, lambda d: d.find_element(By.ID, "user").get_attribute("value") == "u5")
    _wait(driver, lambda d: [r.find_elements(By.TAG_NAME, "td")[0].text for r in _rows(d, "hidden")] == [hidden])
    assert "out of stock" in _rows(driver, "hidden")[0].text
    driver.find_element(By.ID, "api-key").send_keys(KEY)  # this service keeps histories private
    driver.find_element(By.ID, "ask").click()
    _wait(driver, lambda d: len(_rows(d, "answer")) == 10)
    assert not any(f"({hidden})" in i for i in _answer_ids(driver))
    assert "model=sasrec-tiny&user=u5" in driver.find_element(By.ID, "share").get_attribute("href")
    first = _answer_ids(driver)[0].rsplit("(", 1)[-1].rstrip(")")  # "<title> (<id>)"
    _rows(driver, "answer")[0].find_elements(By.TAG_NAME, "button")[1].click()  # "similar"
    _wait(driver, lambda d: len(_rows(d, "similar")) > 0)
    assert f"like {first}" in driver.find_element(By.ID, "similar-of").text
    assert not any(f"({hidden})" in r.find_elements(By.TAG_NAME, "td")[1].text for r in _rows(driver, "similar"))
    driver.find_element(By.ID, "filter").send_keys(f'{{"field": "item_id", "none_of": ["{first}"]}}')
    driver.find_element(By.ID, "ask").click()
    _wait(driver, lambda d: len(_rows(d, "answer")) == 10 and not any(f"({first})" in i for i in _answer_ids(d)))
    assert (
        "1 filtered" in driver.find_element(By.ID, "excluded").text
        or "filtered" in driver.find_element(By.ID, "excluded").text
    )
