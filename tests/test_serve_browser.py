"""The page of ``txl serve`` in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``)
driven by Selenium loads ``/`` from a live ``txl serve`` process, generates (the text streams in, then equals
the API's for the same seed), scores the text with and without memory, and is saved as screenshots at
desktop and phone width under the test's temporary folder."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
selenium = pytest.importorskip(
    "selenium", reason="the browser test needs selenium: pip install 'transformer-xl[serve-test]'"
)
httpx = pytest.importorskip("httpx", reason="the browser test needs httpx")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from serve_helpers import STDLIB, train_char_run  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="headless Chromium not found: apt-get install chromium chromium-driver (.ci/run does)",
    ),
]
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A ``txl serve`` process on a free 127.0.0.1 port; yields its URL."""
    run_dir = train_char_run(tmp_path_factory.mktemp("browser"), steps=300)  # seconds: shades worth a look
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "txl", "serve", str(run_dir), "--port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = proc.stdout.readline()
        second = proc.stdout.readline()
        match = re.search(r"on (http://127\.0\.0\.1:\d+)/$", first.strip())
        assert match, (first, second, proc.stderr.read() if proc.poll() is not None else "")
        assert "listening on 127.0.0.1 only" in second
        url = match.group(1)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "txl serve did not answer"
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        stderr = proc.stderr.read()
    assert code == 0, stderr  # Ctrl-C stops it cleanly
    assert "Traceback" not in stderr, stderr


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_window_size(1280, 1500)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(predicate, *, timeout: float = 60.0, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _set(driver, element_id: str, value: str) -> None:
    element = driver.find_element(By.ID, element_id)
    element.clear()
    element.send_keys(value)


def test_the_page_generates_streams_and_scores(server, browser, tmp_path):
    browser.get(server + "/")
    by_id = browser.find_element
    _wait(lambda: "parameters" in by_id(By.ID, "model-line").text, what="the model card")
    prompt = "def wrap(text, width=70):"
    browser.execute_script("document.getElementById('prompt').value = arguments[0];", prompt)
    _set(browser, "max_tokens", "1000")
    _set(browser, "temperature", "0.8")
    _set(browser, "seed", "11")
    by_id(By.ID, "generate").click()

    lengths = set()  # lengths of the generated text seen while it streams

    def finished() -> bool:
        output = by_id(By.ID, "output").text
        lengths.add(len(output) - len(prompt))
        return "reached max tokens" in by_id(By.ID, "gen-status").text

    _wait(finished, timeout=120, what="the generation to finish")
    status = by_id(By.ID, "gen-status").text
    assert re.search(r"1000 tokens · [\d.]+ tokens/s", status), status
    text = browser.execute_script("return document.getElementById('output').textContent;")
    new = text[len(prompt) :]
    assert text.startswith(prompt) and len(new) > 0
    partial = sorted(n for n in lengths if 0 < n < len(new))
    assert partial, f"no partial text was seen while streaming (lengths seen: {sorted(lengths)})"
    api = httpx.post(
        server + "/v1/completions",
        timeout=120,
        json={"prompt": prompt, "max_tokens": 1000, "temperature": 0.8, "seed": 11},
    ).json()
    assert new == api["choices"][0]["text"]

    generating = tmp_path / "serve-page-generate.png"
    assert browser.save_screenshot(str(generating)) and generating.stat().st_size > 10_000

    by_id(By.ID, "to-score").click()
    assert by_id(By.ID, "view-score").is_displayed() and not by_id(By.ID, "view-generate").is_displayed()
    assert browser.execute_script("return document.getElementById('score-text').value;") == text
    # A barely trained model may write the character vocabulary's unknown symbol, which cannot be scored:
    # score a passage of the training text instead.
    text = (STDLIB / "textwrap.py").read_text(encoding="utf-8")[2000:2600]
    browser.execute_script("document.getElementById('score-text').value = arguments[0];", text)
    by_id(By.ID, "score").click()
    _wait(lambda: by_id(By.ID, "score-status").text not in ("", "scoring…"), timeout=120, what="the scores")
    assert by_id(By.ID, "score-status").text == "done"
    scored = {}
    for memory, column in ((True, "col-memory"), (False, "col-nomemory")):
        api = httpx.post(server + "/v1/score", json={"text": text, "memory": memory}, timeout=120).json()
        spans = browser.find_elements(By.CSS_SELECTOR, f"#{column} .tokens span")
        assert len(spans) == len(api["tokens"]) == len(text)
        mean = by_id(By.ID, column).find_element(By.CLASS_NAME, "mean").text
        assert f"mean loss {api['mean_loss']:.4f} nats/token" in mean, mean
        shaded = [s.value_of_css_property("background-color") for s in spans[1:40]]
        assert len(set(shaded)) > 5  # shades follow the surprisal
        scored[memory] = api["mean_loss"]
    assert scored[True] != scored[False]
    browser.execute_script("window.scrollTo(0, 0)")
    desktop = tmp_path / "serve-page-desktop.png"
    assert browser.save_screenshot(str(desktop)) and desktop.stat().st_size > 10_000

    browser.set_window_size(390, 1400)  # a phone's width
    by_id(By.ID, "tab-generate").click()
    overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth;")
    assert overflow <= 0, f"the page is {overflow}px wider than a phone screen"
    phone = tmp_path / "serve-page-phone.png"
    assert browser.save_screenshot(str(phone)) and phone.stat().st_size > 10_000
    by_id(By.ID, "tab-model").click()
    card = by_id(By.ID, "card").text
    assert "parameters" in card and "char, " in card
    model = tmp_path / "serve-page-model-phone.png"
    assert browser.save_screenshot(str(model))
    print(json.dumps({"screenshots": [str(generating), str(desktop), str(phone), str(model)]}))


def test_the_stream_view_and_what_the_memory_did(server, browser, tmp_path):
    browser.set_window_size(1280, 1500)
    browser.get(server + "/")
    by_id = browser.find_element
    _wait(lambda: "parameters" in by_id(By.ID, "model-line").text, what="the model card")
    source = (STDLIB / "textwrap.py").read_text(encoding="utf-8")
    # the Score view's third column: loss without memory minus loss with memory, per token, in bits
    text = source[3000:3400]
    by_id(By.ID, "tab-score").click()
    browser.execute_script("document.getElementById('score-text').value = arguments[0];", text)
    by_id(By.ID, "score").click()
    _wait(lambda: by_id(By.ID, "score-status").text == "done", timeout=120, what="the scores")
    with_memory, without = (
        httpx.post(server + "/v1/score", json={"text": text, "memory": m}, timeout=120).json()
        for m in (True, False)
    )
    spans = browser.find_elements(By.CSS_SELECTOR, "#col-diff .tokens span")
    assert len(spans) == len(text)
    shown = [float(s.get_attribute("data-helped")) for s in spans[1:]]
    expected = [
        (a["logprob"] - b["logprob"]) / math.log(2)
        for a, b in zip(with_memory["tokens"][1:], without["tokens"][1:], strict=True)
    ]
    assert shown == pytest.approx(expected, abs=2e-3)
    assert (
        any(x > 0.01 for x in expected)
        and len({s.value_of_css_property("background-color") for s in spans}) > 5
    )
    scored = tmp_path / "serve-page-memory-did.png"
    assert browser.save_screenshot(str(scored))

    # the Stream view: two appended texts read through one session, the second with the first's memory
    tgt_len = httpx.get(server + "/v1/model", timeout=10).json()["score"]["tgt_len"]
    first, second = (
        source[5000 : 5001 + tgt_len],
        source[5001 + tgt_len : 5040 + tgt_len],
    )  # split at a segment
    by_id(By.ID, "tab-stream").click()
    for part in (first, second):
        browser.execute_script("document.getElementById('stream-text').value = arguments[0];", part)
        by_id(By.ID, "stream-append").click()
        _wait(
            lambda: "tokens read" in by_id(By.ID, "stream-status").text,
            timeout=60,
            what="the session to read",
        )
        _wait(
            lambda: by_id(By.ID, "stream-text").get_attribute("value") == "",
            timeout=10,
            what="the box to clear",
        )
    assert f"{len(first) + len(second)} tokens read" in by_id(By.ID, "stream-status").text
    spans = browser.find_elements(By.CSS_SELECTOR, "#stream-tokens span")
    assert "".join(s.text for s in spans).replace("\n", "") == (first + second).replace("\n", "")
    bits = [float(s.get_attribute("data-bits")) for s in spans[1:]]
    one_pass = httpx.post(
        server + "/v1/score", json={"text": first + second}, timeout=60
    ).json()  # one segment
    assert bits == pytest.approx([-t["logprob"] / math.log(2) for t in one_pass["tokens"][1:]], abs=2e-3)
    by_id(By.ID, "stream-continue").click()
    _wait(
        lambda: "with what it generated" in by_id(By.ID, "stream-status").text,
        timeout=60,
        what="a continuation",
    )
    streamed = tmp_path / "serve-page-stream.png"
    assert browser.save_screenshot(str(streamed))
    print(json.dumps({"screenshots": [str(scored), str(streamed)]}))


def test_the_tabs_sit_on_their_panel_and_the_key_field_shows_its_hint(server, browser):
    """At desktop and phone width: the first tab starts where its panel does (not at the window's edge), and
    the API-key field is wide enough for its whole placeholder."""
    browser.get(server + "/")
    for width in (1280, 390):
        browser.set_window_size(width, 900)
        tab = browser.find_element(By.ID, "tab-generate").rect
        panel = browser.find_element(By.ID, "view-generate").rect
        assert abs(tab["x"] - panel["x"]) <= 1, (width, tab, panel)
        need, have = browser.execute_script(
            "const el = document.getElementById('api-key'), style = getComputedStyle(el);"
            "const context = document.createElement('canvas').getContext('2d'); context.font = style.font;"
            "return [context.measureText(el.placeholder).width,"
            " el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)];"
        )
        assert need <= have, (
            f"the key field shows {have:.0f}px of its {need:.0f}px placeholder at width {width}"
        )
