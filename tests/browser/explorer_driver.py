"""Drives Debian's chromium (headless) through chromedriver's WebDriver protocol, standard library only:
opens an attention.html, picks a kind of attention from its menu when asked (an encoder-decoder's page:
0 encoder, 1 decoder, 2 cross), reads what the page shows, moves the pointer over one query token, reads
the row it highlights, and saves a screenshot. Prints one JSON object; tests/test_explorer.cpp checks it.

  explorer_driver.py PAGE.html QUERY SCREENSHOT.png [KIND]
Exit 77 (skip) when chromium or chromedriver is missing.
"""
import base64, json, os, shutil, socket, subprocess, sys, time, urllib.error, urllib.request

page, query, shot = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kind = int(sys.argv[4]) if len(sys.argv) > 4 else None
chromium = shutil.which("chromium") or shutil.which("chromium-browser")
driver = shutil.which("chromedriver")
if not chromium or not driver:
    print("chromium and chromedriver are needed (scripts/install-deps.sh installs them)", file=sys.stderr)
    sys.exit(77)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
base = f"http://127.0.0.1:{port}"


def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["value"]
    except urllib.error.HTTPError as e:  # WebDriver says why in the body
        raise RuntimeError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')[:500]}") from None


try:
    for _ in range(100):  # chromedriver up
        try:
            if call("GET", "/status").get("ready"):
                break
        except OSError:
            time.sleep(0.1)
    caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
        "binary": chromium, "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1000"]}}}}
    sid = call("POST", "/session", caps)["sessionId"]
    sess = f"/session/{sid}"
    start = time.perf_counter()
    call("POST", sess + "/url", {"url": "file://" + os.path.abspath(page)})
    load_s = time.perf_counter() - start
    script = lambda js: call("POST", sess + "/execute/sync", {"script": js, "args": []})
    if kind is not None:  # as a person would: click the kind's entry in the menu
        option = call("POST", sess + "/element", {"using": "css selector", "value": f'#kind option[value="{kind}"]'})
        call("POST", f"{sess}/element/{next(iter(option.values()))}/click", {})
    shown = script("const d = headlab.data; return {T: d.T, S: d.S, kind: d.kind, kinds: headlab.kinds,"
                   " layers: d.layers, heads: d.heads, kept: d.kept, tokens: d.tokens, key_tokens: d.key_tokens,"
                   " thumbs: document.querySelectorAll('.thumb').length,"
                   " geometry: headlab.geometry, width: document.getElementById('view').width,"
                   " height: document.getElementById('view').height, state: headlab.state}")
    view = call("POST", sess + "/element", {"using": "css selector", "value": "#view"})
    g = shown["geometry"]
    # W3C pointer offsets are from the element's centre; aim at the query token's row, left column.
    x = int(g["XQ"] - 30 - shown["width"] / 2)
    y = int(g["TOP"] + query * g["ROW"] + g["ROW"] / 2 - shown["height"] / 2)
    call("POST", sess + "/actions", {"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
        "actions": [{"type": "pointerMove", "duration": 0, "origin": view,
                     "x": x, "y": y}]}]})
    hovered = script("return {state: headlab.state, row: headlab.rowWeights(),"
                     " text: document.getElementById('row').textContent}")
    with open(shot, "wb") as f:
        f.write(base64.b64decode(call("GET", sess + "/screenshot")))
    call("DELETE", sess)
    print(json.dumps({"shown": shown, "hovered": hovered, "load_seconds": load_s}))
finally:
    proc.terminate()
