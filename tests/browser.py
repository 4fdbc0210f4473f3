"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no
port, no websocket library), for tests that look at pages as a person would: open a URL, wait
until something is shown, read the text, type into a field, click, take a screenshot.

    with Browser(tmp_path) as b:
        page = b.page("http://127.0.0.1:8265/")
        page.wait_for("document.body.innerText.includes('Actors')", timeout=30)
        text = page.text()

Only 127.0.0.1 addresses are opened; every wait is bounded. Chromium is Debian's package
(``apt-get install -y chromium``; ``make browser`` installs it as root).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

APT = "apt-get update && apt-get install -y chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"headless Chromium is needed for the browser tests and was not found; install it with: {APT}")


class BrowserError(AssertionError):
    pass


class Browser:
    """One Chromium process with a fresh profile in ``tmp``; :meth:`page` opens a tab."""

    def __init__(self, tmp: Path, *, width: int = 1280, height: int = 900):
        self.tmp = Path(tmp)
        self.width, self.height = width, height
        self._id = 0
        self._buf = b""
        self.events: list[dict] = []

    def __enter__(self) -> "Browser":
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        profile = self.tmp / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        def fds():  # in the child, before exec: Chromium reads commands on fd 3 and replies on fd 4
            import fcntl

            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = open(self.tmp / "chromium.log", "wb")
        self.proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}",
                                      f"--window-size={self.width},{self.height}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
                                     preexec_fn=fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.w, self.r = to_chrome_w, from_chrome_r
        os.set_blocking(self.r, False)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (BrowserError, OSError, ValueError):  # Chromium already gone (TimeoutError is an OSError): closing anyway
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self.w, self.r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()

    # -- the protocol --------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from Chromium")
            ready, _, _ = select.select([self.r], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited; its log: {(self.tmp / 'chromium.log').read_text()[-2000:]}")
                self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, *, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self._id += 1
        cmd = {"id": self._id, "method": method, "params": params or {}}
        if session:
            cmd["sessionId"] = session
        data = json.dumps(cmd).encode() + b"\0"
        while data:
            data = data[os.write(self.w, data):]
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_message(deadline)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def page(self, url: str, *, timeout: float = 60.0) -> "Page":
        assert url.startswith(("http://127.0.0.1", "file://", "about:")), f"tests open only local pages: {url}"
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        p = Page(self, session)
        p.call("Page.enable")
        p.call("Runtime.enable")
        p.call("Network.enable")
        p.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                       "deviceScaleFactor": 1, "mobile": False})
        p.goto(url, timeout=timeout)
        return p


class Page:
    def __init__(self, browser: Browser, session: str):
        self.b, self.session = browser, session

    def call(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        return self.b.call(method, params, session=self.session, timeout=timeout)

    def goto(self, url: str, *, timeout: float = 60.0) -> None:
        assert url.startswith(("http://127.0.0.1", "file://", "about:")), f"tests open only local pages: {url}"
        self.call("Page.navigate", {"url": url}, timeout=timeout)
        self.wait_for("document.readyState === 'complete'", timeout=timeout)

    def eval(self, expression: str, *, timeout: float = 30.0):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                      timeout=timeout)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression[:80]}: {r['exceptionDetails'].get('text')} "
                               f"{r['exceptionDetails'].get('exception', {}).get('description', '')}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, *, timeout: float = 30.0, every: float = 0.25):
        """Poll ``expression`` until it is truthy (its value is returned); a bounded wait."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.eval(expression)
            except BrowserError as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(every)
        raise BrowserError(f"waited {timeout:.0f} s for {expression!r} (last: {last!r}); page text: "
                           f"{(self.text() or '')[:1500]!r}")

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` as keystrokes (React sees real input events)."""
        self.eval(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", {"text": text})

    def click(self, selector: str) -> None:
        self.eval(f"document.querySelector({json.dumps(selector)}).click()")

    def click_at(self, x: float, y: float) -> None:
        """A real mouse click at page coordinates (for controls that are not plain buttons)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, path: Path, *, full: bool = False) -> Path:
        params = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params, timeout=60)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def images(self) -> list[dict]:
        """Every <img> on the page: its natural size, and whether it decoded."""
        return self.eval("""Promise.all([].map.call(document.images, function (i) {
            return (i.decode ? i.decode().then(function () { return true; }, function () { return false; })
                             : Promise.resolve(i.complete)).then(function (ok) {
              return {src: i.currentSrc.slice(0, 60), w: i.naturalWidth, h: i.naturalHeight, ok: ok && i.naturalWidth > 0};
            });
        }))""", timeout=60)
