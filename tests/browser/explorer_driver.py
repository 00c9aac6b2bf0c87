"""Drives Debian's chromium (headless) through chromedriver's WebDriver protocol, standard library only:
opens an attention.html (at an address naming a head with --hash), picks a kind of attention from its menu
when asked (an encoder-decoder's page: 0 encoder, 1 decoder, 2 cross), reads what the page shows, scrolls
one query token into view and moves the pointer over it, reads the row it highlights and where that row
lies on the page, then (--click) clicks a head's thumbnail and reads the address, and (--then-hash) types
another address and reads the view; saves a screenshot. Prints one JSON object; tests/test_explorer.cpp
checks it.

  explorer_driver.py PAGE.html QUERY SCREENSHOT.png [--kind K] [--hash L1H3] [--click L,H] [--then-hash L1]
Exit 77 (skip) when chromium or chromedriver is missing.
"""
import argparse, json, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from webdriver import Browser  # noqa: E402

args = argparse.ArgumentParser()
args.add_argument("page")
args.add_argument("query", type=int)
args.add_argument("shot")
args.add_argument("--kind", type=int)
args.add_argument("--hash", default="")
args.add_argument("--click", default="")
args.add_argument("--then-hash", default="")
a = args.parse_args()
# What the page shows now: its view, the address and the link line.
VIEW = ("return {state: Object.assign({}, headlab.state), view: headlab.view(), hash: location.hash,"
        " link: document.getElementById('link').textContent}")

with Browser() as browser:
    script, element, click = browser.script, browser.element, browser.click
    start = time.perf_counter()
    browser.open("file://" + os.path.abspath(a.page) + ("#" + a.hash if a.hash else ""))
    load_s = time.perf_counter() - start
    opened = script(VIEW)
    if a.kind is not None:  # as a person would: click the kind's entry in the menu
        click(element(f'#kind option[value="{a.kind}"]'))
    shown = script("const d = headlab.data; return {T: d.T, S: d.S, kind: d.kind, kinds: headlab.kinds,"
                   " layers: d.layers, heads: d.heads, kept: d.kept, tokens: d.tokens, key_tokens: d.key_tokens,"
                   " thumbs: document.querySelectorAll('.thumb').length,"
                   " geometry: headlab.geometry, width: document.getElementById('view').width,"
                   " height: document.getElementById('view').height, state: headlab.state}")
    g = shown["geometry"]
    # The query's row scrolled into view (a long prompt's is below the box's fold), then the pointer over
    # the token in the left column, in the viewport's coordinates.
    at = script(f"const box = document.getElementById('view-box');"
                f" box.scrollTop = Math.max(0, {g['TOP'] + a.query * g['ROW']} - box.clientHeight / 2);"
                " const r = document.getElementById('view').getBoundingClientRect(); return {left: r.left, top: r.top}")
    x = int(at["left"] + g["XQ"] - 30)
    y = int(at["top"] + g["TOP"] + a.query * g["ROW"] + g["ROW"] / 2)
    browser.move_pointer(x, y)
    hovered = script("const box = e => { const r = document.getElementById(e).getBoundingClientRect();"
                     " const el = document.getElementById(e); return {left: r.left, right: r.right, width: r.width,"
                     " scrollWidth: el.scrollWidth, clientWidth: el.clientWidth}; };"
                     " return {state: headlab.state, row: headlab.rowWeights(),"
                     " text: document.getElementById('row').textContent,"
                     " layout: {viewport: window.innerWidth, page: document.documentElement.scrollWidth,"
                     " row: box('row'), side: box('side')}}")
    browser.screenshot(a.shot)
    result = {"opened": opened, "shown": shown, "hovered": hovered, "load_seconds": load_s}
    if a.click:  # a head's thumbnail, clicked
        layer, head = a.click.split(",")
        click(element(f'.thumb[data-layer="{layer}"][data-head="{head}"] canvas'))
        result["clicked"] = script(VIEW)
    if a.then_hash:  # another address typed into the same page
        script(f"location.hash = {json.dumps(a.then_hash)}")
        time.sleep(0.2)  # hashchange is delivered as a task
        result["rehashed"] = script(VIEW)
print(json.dumps(result))
