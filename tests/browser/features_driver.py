"""Opens a features.html (`headlab sae pages`) in headless chromium at an address naming a feature (--hash F3),
reads what the page shows (the feature, each context's tokens with their computed background colour), clicks the
list's entry --click-index and reads the address and view again, types --then-hash and reads it once more; saves a
screenshot. Prints one JSON object; tests/test_sae_pages.cpp checks it.

  features_driver.py PAGE.html SCREENSHOT.png [--hash F3] [--click-index 1] [--then-hash F7]
Exit 77 (skip) when chromium or chromedriver is missing.
"""
import argparse, json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from webdriver import Browser  # noqa: E402

args = argparse.ArgumentParser()
args.add_argument("page")
args.add_argument("shot")
args.add_argument("--hash", default="")
args.add_argument("--click-index", type=int)
args.add_argument("--then-hash", default="")
a = args.parse_args()
VIEW = "return Object.assign(headlab.view(), {hash: location.hash, listed: document.querySelectorAll('#list div').length})"

with Browser() as browser:
    browser.open("file://" + os.path.abspath(a.page) + ("#" + a.hash if a.hash else ""))
    result = {"opened": browser.script(VIEW)}
    browser.screenshot(a.shot)
    if a.click_index is not None:
        browser.click(browser.element(f'#list div[data-index="{a.click_index}"]'))
        result["clicked"] = browser.script(VIEW)
    if a.then_hash:
        browser.script(f"location.hash = {json.dumps(a.then_hash)}")
        time.sleep(0.2)  # hashchange is delivered as a task
        result["rehashed"] = browser.script(VIEW)
print(json.dumps(result))
