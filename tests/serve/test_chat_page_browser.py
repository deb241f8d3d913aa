"""The chat page at `/` in headless Chromium (selenium, Debian's `chromium` and
`chromium-driver`) against a real `geist serve` with the default model: a typed prompt
streams a reply that equals the API's greedy answer, the system prompt box reaches the
model, and Stop ends the generation on the server. A screenshot of the page is kept at
build/serve-browser/chat_page.png (scripts/test.sh names it).

CHROMIUM and CHROMEDRIVER name the binaries (default /usr/bin/chromium,
/usr/bin/chromedriver). Without them or without selenium the test says SKIP and why; with
GEIST_BROWSER_REQUIRED=1 (scripts/test.sh sets it where Debian's chromium and
chromium-driver are installed) it FAILS instead."""
import json
import os
import pathlib
import shutil
import time

import pytest

from conftest import API_KEY, ROOT, http, import_or_skip, skip_or_fail

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = ROOT / "build/serve-browser"
BROWSER_REQUIRED = os.environ.get("GEIST_BROWSER_REQUIRED") == "1"
SYSTEM = "You are a pirate. Answer every question in one short sentence, as a pirate would."


@pytest.fixture(scope="module")
def browser():
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not pathlib.Path(path).exists():
            skip_or_fail(f"SKIP: no {path} (apt-get install {pkg}; scripts/install_deps.sh does)",
                         BROWSER_REQUIRED, "GEIST_BROWSER_REQUIRED")
    import_or_skip("selenium", BROWSER_REQUIRED, "GEIST_BROWSER_REQUIRED")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download a browser or driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1000,800", "--disable-extensions", "--no-first-run"):
        opts.add_argument(a)
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    except Exception as e:  # e.g. Ubuntu's chromium package, a stub that wants snapd
        skip_or_fail(f"SKIP: Chromium ({CHROMIUM}, {CHROMEDRIVER}) does not start: {str(e).splitlines()[0]}",
                     BROWSER_REQUIRED, "GEIST_BROWSER_REQUIRED")
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# Records every text the last reply shows, as it changes (a MutationObserver in the page),
# so that the test sees the reply grow piece by piece rather than polling for it.
OBSERVE = """
window.__seen = [];
new MutationObserver(() => {
  const m = document.querySelectorAll('#log .m');
  const last = m[m.length - 1];
  if (last && last.classList.contains('assistant')) window.__seen.push(last.textContent);
}).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});
"""


def set_value(driver, elem_id, value):
    e = driver.find_element("id", elem_id)
    e.clear()
    e.send_keys(str(value))


def api_reply(srv, messages, max_tokens):
    status, _, raw = http("POST", srv.url + "/v1/chat/completions",
                          {"messages": messages, "max_tokens": max_tokens, "temperature": 0},
                          {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert status == 200, raw
    return json.loads(raw)


def test_chat_page_in_chromium(srv, browser):
    from selenium.webdriver.common.keys import Keys
    d = browser
    d.get(srv.url + "/")
    assert d.title == "geist"
    d.execute_script(OBSERVE)
    set_value(d, "key", API_KEY)  # the server of the tests wants one
    set_value(d, "temp", 0)
    set_value(d, "max", 48)

    # 1. A typed prompt (Enter sends) streams a reply: the text grows in several steps and
    # ends as the API's greedy answer to the same message.
    prompt = "Write three sentences about the sea."
    d.find_element("id", "msg").send_keys(prompt, Keys.ENTER)
    wait_for(lambda: d.find_element("id", "stop").is_enabled(), 10, "the Stop button to enable")
    wait_for(lambda: d.find_element("id", "send").is_enabled(), 60, "the reply to finish")
    replies = d.find_elements("css selector", "#log .m.assistant")
    users = d.find_elements("css selector", "#log .m.user")
    assert [u.text for u in users] == [prompt]
    reply = replies[-1].get_attribute("textContent")
    expected = api_reply(srv, [{"role": "user", "content": prompt}], 48)
    assert reply == expected["choices"][0]["message"]["content"]
    seen = [s for s in d.execute_script("return window.__seen") if s]
    assert len(set(seen)) >= 3, f"the reply did not stream: {seen}"
    assert all(reply.startswith(s) for s in seen)  # each step a prefix of the final text
    assert "error" not in replies[-1].get_attribute("class")
    assert f"prompt {expected['usage']['prompt_tokens']} tokens" in d.find_element("id", "stats").text

    # 2. The system prompt box: after Clear, the same question with a system text gives
    # what the API gives for [system, user], and its prompt has the system tokens.
    d.find_element("id", "clear").click()
    set_value(d, "sys", SYSTEM)
    d.find_element("id", "msg").send_keys("What is the sea?", Keys.ENTER)
    wait_for(lambda: d.find_element("id", "stop").is_enabled(), 10, "the Stop button to enable")
    wait_for(lambda: d.find_element("id", "send").is_enabled(), 60, "the reply to finish")
    with_sys = api_reply(srv, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the sea?"}],
                         48)
    without = api_reply(srv, [{"role": "user", "content": "What is the sea?"}], 48)
    assert with_sys["usage"]["prompt_tokens"] > without["usage"]["prompt_tokens"]
    stats = d.find_element("id", "stats").text
    assert f"prompt {with_sys['usage']['prompt_tokens']} tokens" in stats, stats
    reply = d.find_elements("css selector", "#log .m.assistant")[-1].get_attribute("textContent")
    assert reply == with_sys["choices"][0]["message"]["content"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    d.save_screenshot(str(SHOTS / "chat_page.png"))

    # 3. Stop: a long reply is cut off; the page is ready again, the text stops growing,
    # and the server cancels the generation and frees the slot.
    before = srv.metrics(headers={"Authorization": f"Bearer {API_KEY}"})
    d.find_element("id", "clear").click()
    set_value(d, "sys", "")
    set_value(d, "max", 1500)
    d.execute_script("window.__seen = []")
    d.find_element("id", "msg").send_keys("Count from 1 to 1000, one number per line.", Keys.ENTER)
    wait_for(lambda: len(d.execute_script("return window.__seen")) >= 5, 30, "the long reply to start")
    d.find_element("id", "stop").click()
    wait_for(lambda: d.find_element("id", "send").is_enabled(), 10, "the page to be ready after Stop")
    assert not d.find_element("id", "stop").is_enabled()
    out = d.find_elements("css selector", "#log .m.assistant")[-1]
    text = out.get_attribute("textContent")
    time.sleep(0.5)
    assert out.get_attribute("textContent") == text  # nothing arrives after Stop
    assert "error" not in out.get_attribute("class")

    def cancelled():
        m = srv.metrics(headers={"Authorization": f"Bearer {API_KEY}"})
        return m if (m["geist_requests_cancelled_total"] > before["geist_requests_cancelled_total"]
                     and m["geist_slots_busy"] == 0) else None
    m = wait_for(cancelled, 10, "the server to cancel the stopped reply")
    generated = m["geist_generated_tokens_total"] - before["geist_generated_tokens_total"]
    assert generated < 1500, generated  # stopped long before max tokens
    d.save_screenshot(str(SHOTS / "chat_page_stopped.png"))
