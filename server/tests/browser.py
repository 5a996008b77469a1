"""Drives the chat page at URL in headless Chromium (selenium): streaming, Stop, reload.

usage: browser.py URL [SCREENSHOT.png]
Prints one line per check; exits 1 on the first failure.
"""
import json
import shutil
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

URL = sys.argv[1]
SHOT = sys.argv[2] if len(sys.argv) > 2 else ""


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)
    print(f"ok: {what}")


def slots():
    with urllib.request.urlopen(URL + "/slots", timeout=10) as r:
        return json.load(r)


def wait(driver, what, cond, timeout=60):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: cond(d))
    except Exception as e:
        check(False, f"{what} ({type(e).__name__}; last answer: {last(driver, '.msg.assistant')!r})")


# Counts changes of the last assistant answer's text (each SSE delta is one DOM update).
OBSERVE = """
window.__updates = [];
const box = document.getElementById('messages');
new MutationObserver(() => {
  const a = [...box.querySelectorAll('.msg.assistant .body')].pop();
  const t = a ? a.textContent : '';
  if (window.__updates[window.__updates.length - 1] !== t) window.__updates.push(t);
}).observe(box, {subtree: true, childList: true, characterData: true});
"""


def last(driver, css):
    """Text of the last element matching css ("" when there is none yet)."""
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return els[-1].text if els else ""


def set_field(driver, el_id, value):
    el = driver.find_element(By.ID, el_id)
    driver.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change'))", el, value)


def main():
    profile = tempfile.mkdtemp(prefix="pn-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for f in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1200,900"]:
        opts.add_argument(f)
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(service=service, options=opts)
    try:
        run(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    print("browser: all checks passed")


def run(driver):
    driver.get(URL + "/")
    check(driver.title == "pn serve: chat", f"page loads (title {driver.title!r})")
    set_field(driver, "temperature", "0")
    set_field(driver, "max-tokens", "96")
    driver.execute_script(OBSERVE)

    # 1. a prompt, sent with Enter; the answer streams in
    box = driver.find_element(By.ID, "prompt")
    box.send_keys("def fibonacci(n):")
    box.send_keys(Keys.SHIFT, Keys.ENTER)  # Shift+Enter: a new line, not a send
    check("\n" in box.get_attribute("value") and not driver.find_elements(By.CSS_SELECTOR, ".msg.user"),
          "Shift+Enter adds a line and sends nothing")
    box.send_keys("    # return the n-th Fibonacci number")
    box.send_keys(Keys.ENTER)
    wait(driver, "the answer finishes (stats line shown)", lambda d: "tokens/s" in last(d, ".msg.assistant .stats"), 120)
    updates = driver.execute_script("return window.__updates")
    non_empty = [u for u in updates if u]
    check(len(non_empty) >= 3, f"streamed text arrived in {len(non_empty)} DOM updates (>= 3)")
    check(all(non_empty[i + 1].startswith(non_empty[i]) for i in range(len(non_empty) - 1)), "each update extends the text")
    answer = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
    stats = answer.find_element(By.CLASS_NAME, "stats").text
    check("TTFT" in stats and "cached prompt tokens" in stats, f"stats line: {stats!r}")
    first_text = answer.find_element(By.CLASS_NAME, "body").text
    check(len(first_text) > 0, "the answer has text")

    # 2. turn 2 reuses the prefix cache (cached prompt tokens > 0)
    box.send_keys("Now write it iteratively.", Keys.ENTER)
    wait(driver, "turn 2 finishes",
         lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")) == 2
         and "tokens/s" in d.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text, 120)
    stats2 = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text
    cached = int(stats2.split("cached prompt tokens")[1].split()[0])
    check(cached > 0, f"turn 2 reports cached prompt tokens: {cached}")
    if SHOT:
        driver.save_screenshot(SHOT)
        print(f"screenshot: {SHOT}")

    # 3. a long answer, stopped mid-way: the slot is freed. The page renders behind the
    # stream, so on a loaded machine the server can finish all max_tokens before the
    # click lands (the turn then ends at "length"): then a new chat asks again, up to
    # three times; a Stop that never takes still fails.
    attempts = 0
    while True:
        attempts += 1
        driver.find_element(By.ID, "new-chat").click()
        set_field(driver, "max-tokens", "1500")
        # the first prompt again: greedy, it runs past 96 tokens (above)
        box.send_keys("def fibonacci(n):")
        box.send_keys(Keys.SHIFT, Keys.ENTER)  # Shift stays down to the end of one send_keys
        box.send_keys("    # return the n-th Fibonacci number", Keys.ENTER)
        wait(driver, "a long answer starts streaming", lambda d: len(last(d, ".msg.assistant .body")) > 20, 60)
        busy = [s for s in slots()["slots"] if s["state"] != "idle"]
        check(len(busy) == 1, f"one slot busy while streaming ({[s['state'] for s in slots()['slots']]})")
        driver.find_element(By.ID, "stop").click()
        deadline = time.time() + 10
        while time.time() < deadline and any(s["state"] != "idle" for s in slots()["slots"]):
            time.sleep(0.05)
        check(all(s["state"] == "idle" for s in slots()["slots"]), "Stop frees the slot (/slots all idle)")
        stopped = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .stats")[-1].text
        if "stopped" in stopped or attempts == 3 or "length" not in stopped:
            break
        print(f"note: the answer ended before the Stop landed ({stopped!r}); asking again")
    check("stopped" in stopped, f"the answer is marked stopped: {stopped!r}")

    # 4. reload: every conversation is listed (newest first); the stopped one is open with
    # its partial answer, the first (the oldest) opens with both answers
    stopped_text = last(driver, ".msg.assistant .body")
    driver.refresh()
    items = driver.find_elements(By.CSS_SELECTOR, "#conversations li")
    titles = [li.text for li in items]
    check(len(titles) == 1 + attempts and all("# return" in t for t in titles), f"conversations after reload: {titles}")
    check(last(driver, ".msg.assistant .body") == stopped_text and len(stopped_text) > 20, "the stopped answer is kept as far as it got")
    items[-1].click()
    bodies = [b.text for b in driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .body")]
    check(len(bodies) == 2 and bodies[0] == first_text, "the first conversation holds its two answers")

if __name__ == "__main__":
    main()
