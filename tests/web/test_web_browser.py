"""End to end in a real headless browser: ``archive-manager serve`` runs as a process, and
Debian's Chromium, driven by Selenium through chromedriver, opens the pool page, follows an
archive, filters it by status, opens a sample, checks what is shown (texts, trained tokens,
the log-prob chart, a tensor summary loaded on demand, hostile text inert) and saves
screenshots.

Skipped, with the reason shown, when Chromium or chromedriver is missing (``apt-get install
chromium chromium-driver``); ``$ARCHIVE_MANAGER_REQUIRE_BROWSER`` (set by CI) makes that a
failure instead.  With ``$ARCHIVE_MANAGER_SCREENSHOTS=<folder>`` the README's screenshots are
written there too.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_web import HOSTILE_RESPONSE, running_server

from archive_manager import ArchiveManager, Sample
from archive_manager.interop.synthetic import make_rollout

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REQUIRE_ENV = "ARCHIVE_MANAGER_REQUIRE_BROWSER"
SCREENSHOTS_ENV = "ARCHIVE_MANAGER_SCREENSHOTS"
#: Flags that keep Chromium from reaching for a network this machine does not have (it would
#: retry update checks, sync and field trials for the whole test otherwise).
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
    "--window-size=1280,1000",
)


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium driven by Selenium, with a fresh profile in ``tmp_path``."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        _unavailable(
            f"no browser for the end-to-end test: {', '.join(missing)} missing "
            "(apt-get install chromium chromium-driver)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ModuleNotFoundError:
        _unavailable("selenium is not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def drift_pool(root: Path, rollouts: int = 12) -> None:
    """A small pool whose rollouts drift: reward rises, truncation falls; evaluation
    rollouts every fourth step; part of each response is not trained on (tool output)."""
    rng = random.Random(0)
    with ArchiveManager.open(root, inline_limit=1024) as pool:
        for rid in range(rollouts):
            for evaluation in (False, True):
                if evaluation and rid % 4:
                    continue
                samples: list[Any] = make_rollout(
                    16,
                    seed=2 * rid + evaluation,
                    rollout_id=rid,
                    prompt_len=24,
                    response_min=24 + 3 * rid,
                    response_max=96,
                    group_size=4,
                    r3_layers=2,
                )
                success = 0.2 + 0.6 * rid / max(1, rollouts - 1) + (0.1 if evaluation else 0.0)
                for s in samples:
                    if rng.random() < 0.4 - 0.03 * rid:
                        s.status = Sample.Status.TRUNCATED
                        s.reward = 0.0
                    else:
                        s.reward = float(rng.random() < success)
                    n = s.response_length
                    s.loss_mask = [1] * (n // 3) + [0] * (n // 4) + [1] * (n - n // 3 - n // 4)
                    # The same prompts in every rollout, so each has a history across training.
                    s.task_key = f"prompt-{s.group_index}"

                kind = "eval" if evaluation else "train"
                pool.save(
                    f"{kind}-rollout-{rid:03d}", samples, rollout_id=rid, evaluation=evaluation
                )
        hostile: Any = make_rollout(2, seed=99, prompt_len=8, response_min=8, response_max=12)
        hostile[0].response = HOSTILE_RESPONSE
        # No rollout id: it stays off the drift charts.
        pool.save("hostile", hostile, rollout_id=None)
        pool.open_archive("train-rollout-001").release()


def _screenshot(target: Any, name: str, tmp_path: Path) -> None:
    """Save a screenshot of a page (the window) or of one element, and check it is an image."""
    path = tmp_path / name
    # A WebDriver saves its window; a WebElement only itself.
    save = getattr(target, "save_screenshot", None) or target.screenshot
    assert save(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_bytes(path.read_bytes())


def test_browse_pool_archive_and_sample(browser: Any, tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    root = tmp_path / "pool"
    drift_pool(root)
    with ArchiveManager.open(root) as pool:
        arc = pool.open_archive("train-rollout-004")
        meta = arc.sample_metadata()
        truncated = [i for i, d in enumerate(meta) if d["status"] == "truncated"]
        first = arc.load_sample(truncated[0])
    assert truncated, "the pool must hold truncated samples to filter by"
    wait = WebDriverWait(browser, 30)

    with running_server(root) as (url, _line):
        # The pool page: archives, states, and the three drift charts drawn as SVG.
        browser.get(url)
        assert browser.title.startswith("Pool ")
        charts = browser.find_element(By.ID, "drift-charts")
        assert len(charts.find_elements(By.TAG_NAME, "svg")) == 3
        assert charts.find_elements(By.CSS_SELECTOR, "polyline.line")
        archives = browser.find_element(By.ID, "archives")
        assert "released" in archives.text and "archive:train-rollout-004" in archives.text
        _screenshot(charts, "drift-charts.png", tmp_path)

        # Follow an archive, then filter it by status with the form.
        archives.find_element(By.LINK_TEXT, "train-rollout-004").click()
        wait.until(ec.title_contains("train-rollout-004"))
        rows = browser.find_elements(By.CSS_SELECTOR, "#samples tbody tr")
        assert len(rows) == len(meta)
        Select(browser.find_element(By.ID, "status-filter")).select_by_value("truncated")
        browser.find_element(By.ID, "apply-filters").click()
        wait.until(ec.url_contains("status=truncated"))
        cells = browser.find_elements(By.CSS_SELECTOR, "#samples tbody td.status-cell")
        assert [c.text for c in cells] == ["truncated"] * len(truncated)
        positions = [
            int(a.text) for a in browser.find_elements(By.CSS_SELECTOR, "#samples a.sample-link")
        ]
        assert positions == truncated

        # Open a sample and check what it shows.
        browser.find_element(By.CSS_SELECTOR, "#samples a.sample-link").click()
        wait.until(ec.presence_of_element_located((By.ID, "tokens")))
        assert browser.find_element(By.ID, "response").text == first.response
        assert browser.find_element(By.ID, "sample-status").text == "truncated"
        n = first.response_length
        trained = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.m1")
        untrained = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok.m0")
        assert (len(trained), len(untrained)) == (n - n // 4, n // 4)
        response_ids = first.tokens[-n:]
        assert [int(t.text) for t in untrained] == response_ids[n // 3 : n // 3 + n // 4]
        # Trained tokens look different from the others.
        assert trained[0].value_of_css_property("background-color") != untrained[
            0
        ].value_of_css_property("background-color")
        assert browser.find_elements(By.CSS_SELECTOR, "#logprob-chart polyline.line")
        assert browser.find_elements(By.CSS_SELECTOR, "#logprob-chart rect.band")
        tensors = browser.find_element(By.ID, "tensors")
        shape = list(first.rollout_routed_experts.shape)
        assert "rollout_routed_experts" in tensors.text and str(shape) in tensors.text
        tensors.find_element(By.CSS_SELECTOR, "a.tensor-load").click()
        summary = tensors.find_element(By.CSS_SELECTOR, ".tensor-summary")
        wait.until(lambda _: 'dtype: "int32"' in summary.text)
        assert f"elements: {shape[0] * shape[1] * shape[2]}" in summary.text
        browser.set_window_size(1280, 2000)  # down to the tokens
        browser.execute_script("window.scrollTo(0, 0)")
        _screenshot(browser, "sample-page.png", tmp_path)

        # Hostile model output is shown as text and runs nothing.
        browser.get(url + "archive/hostile/sample/0")
        assert browser.find_element(By.ID, "response").text == HOSTILE_RESPONSE
        assert browser.execute_script("return document.querySelectorAll('main script').length") == 0
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018

        # An unknown position is a clear page.
        browser.get(url + "archive/train-rollout-004/sample/999")
        assert "404" in browser.title
        assert "no sample at position 999" in browser.find_element(By.TAG_NAME, "main").text

        # The RL lens: pool -> archive -> group -> prompt history -> compare -> sample.
        browser.get(url)
        browser.find_element(By.ID, "archives").find_element(
            By.LINK_TEXT, "train-rollout-006"
        ).click()
        wait.until(ec.title_contains("train-rollout-006"))
        browser.find_element(By.CSS_SELECTOR, "#samples a[href*='/group?task_key=']").click()
        wait.until(ec.presence_of_element_located((By.ID, "group-members")))
        members = browser.find_elements(By.CSS_SELECTOR, "#group-members tbody tr")
        assert len(members) == 4 and "prompt-" in browser.find_element(By.TAG_NAME, "h1").text
        browser.find_element(By.ID, "view-toggle").click()  # responses as Markdown
        wait.until(ec.url_contains("view=markdown"))
        assert len(browser.find_elements(By.CSS_SELECTOR, "#group-members .markdown")) == 4
        _screenshot(browser, "group-page.png", tmp_path)
        browser.find_element(By.LINK_TEXT, "this prompt across rollouts").click()
        wait.until(ec.presence_of_element_located((By.ID, "prompt-history")))
        rows = browser.find_elements(By.CSS_SELECTOR, "#prompt-history tbody tr")
        assert len(rows) >= 12  # every training rollout saw it, and the evaluation ones
        assert browser.find_elements(By.CSS_SELECTOR, "#prompt-chart polyline.line")
        _screenshot(browser, "prompt-history.png", tmp_path)
        browser.find_elements(By.CSS_SELECTOR, "#prompt-history a.compare-link")[-1].click()
        wait.until(ec.presence_of_element_located((By.ID, "compare")))
        sides = browser.find_elements(By.CSS_SELECTOR, "#compare section.side")
        assert len(sides) == 2 and all(s.find_element(By.CSS_SELECTOR, ".response") for s in sides)
        _screenshot(browser, "compare-page.png", tmp_path)
        expected = sides[1].find_element(By.CSS_SELECTOR, "pre.response").text
        sides[1].find_element(By.CSS_SELECTOR, "a.sample-link").click()
        wait.until(ec.presence_of_element_located((By.ID, "tokens")))
        assert browser.find_element(By.ID, "response").text == expected

        # The search box in the header: the matching samples, their lines highlighted.
        box = browser.find_element(By.CSS_SELECTOR, "#search-box input[name=q]")
        box.send_keys("equation solve")
        box.submit()
        wait.until(ec.presence_of_element_located((By.ID, "search-results")))
        marks = browser.find_elements(By.CSS_SELECTOR, "#search-results mark")
        assert marks and all(m.text == "equation solve" for m in marks)
        _screenshot(browser, "search-page.png", tmp_path)
