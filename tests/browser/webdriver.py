"""Debian's chromium (headless) through chromedriver's WebDriver protocol, standard library only, for the page
drivers beside this file (explorer_driver.py, features_driver.py):

    with Browser() as b:            # exits 77 (the tests' skip) when chromium or chromedriver is missing
        b.open("file:///.../page.html#F3")
        b.script("return headlab.view()")
        b.click(b.element("#list div"))
        b.screenshot("shot.png")
"""
import base64, json, shutil, socket, subprocess, sys, time, urllib.error, urllib.request


class Browser:
    def __enter__(self):
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        driver = shutil.which("chromedriver")
        if not chromium or not driver:
            print("chromium and chromedriver are needed (scripts/install-deps.sh installs them)", file=sys.stderr)
            sys.exit(77)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):  # chromedriver up
                try:
                    if self.call("GET", "/status").get("ready"):
                        break
                except OSError:
                    time.sleep(0.1)
            caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1000"]}}}}
            self.sess = "/session/" + self.call("POST", "/session", caps)["sessionId"]
        except BaseException:
            self.proc.terminate()
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.call("DELETE", self.sess)
        finally:
            self.proc.terminate()

    def call(self, method, path, body=None):
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:  # WebDriver says why in the body
            raise RuntimeError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')[:500]}") from None

    def open(self, url):
        self.call("POST", self.sess + "/url", {"url": url})

    def script(self, js):
        return self.call("POST", self.sess + "/execute/sync", {"script": js, "args": []})

    def element(self, css):
        return self.call("POST", self.sess + "/element", {"using": "css selector", "value": css})

    def click(self, el):
        self.call("POST", f"{self.sess}/element/{next(iter(el.values()))}/click", {})

    def move_pointer(self, x, y):
        self.call("POST", self.sess + "/actions", {"actions": [{"type": "pointer", "id": "mouse",
                  "parameters": {"pointerType": "mouse"},
                  "actions": [{"type": "pointerMove", "duration": 0, "origin": "viewport", "x": x, "y": y}]}]})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("GET", self.sess + "/screenshot")))
