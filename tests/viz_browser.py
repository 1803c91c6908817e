"""A real headless Chromium driven through the Chrome DevTools protocol over a pipe (standard library only).

`--remote-debugging-pipe` makes Chromium read protocol messages on fd 3 and write on fd 4, each a JSON object
ended by a NUL byte: no websocket client and no extra package are needed.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--hide-scrollbars", "--remote-debugging-pipe",
)


def chromium_or_reason() -> tuple[Path | None, str]:
    """Debian's chromium, installed with apt-get when missing and this process is root; else None and why."""
    if CHROMIUM.exists():
        return CHROMIUM, ""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return None, f"{CHROMIUM} is missing and cannot be installed here (needs root and apt-get)"
    result = subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, text=True, timeout=900)
    if result.returncode != 0 or not CHROMIUM.exists():
        return None, f"apt-get install -y chromium failed: {result.stderr.strip()[-300:]}"
    return CHROMIUM, ""


class Browser:
    """One headless Chromium with one page; `call` sends a command to the page and returns its result."""

    def __init__(self, executable: Path, *, width: int = 1400, height: int = 1000, timeout: float = 60.0,
                 flags: tuple[str, ...] = ()) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="attnkit-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # bash puts our pipe ends, whatever their numbers, on the protocol's fixed descriptors (Chromium reads 3,
        # writes 4); pass_fds=(3, 4) needs them open here, and dash takes single-digit descriptors only
        redirect = f'exec "$@" 3<&{to_browser_read} 4>&{from_browser_write}'
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", redirect, "bash", str(executable), *FLAGS, *flags,
             f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}"],
            pass_fds=(to_browser_read, from_browser_write), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._next_id, self._buffer, self.events = 0, b"", []
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def _receive(self) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], self.timeout)
            chunk = os.read(self._from_browser, 1 << 20) if ready else b""
            if not chunk:
                raise TimeoutError("Chromium sent nothing (it exited or hung)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict | None = None) -> dict:
        return self._send(method, params, self._session)

    def open(self, path: Path) -> None:
        """Load a local file and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", {"url": path.resolve().as_uri()})
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._receive())

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, seconds: float = 30.0):
        """Poll `expression` in the page until it is truthy; its value."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"the page never reached: {expression}")

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the first element matching `selector`."""
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent",
                      {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])

    def close(self) -> None:
        try:
            self._send("Browser.close")
        except (TimeoutError, RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile.cleanup()


def served_page(url: str, ready: str, *, width: int, height: int) -> tuple[Browser | None, str]:
    """A Browser showing `url` once the page's `ready` expression is truthy; else None and why there is none."""
    executable, reason = chromium_or_reason()
    if executable is None:
        return None, reason
    browser = Browser(executable, width=width, height=height)
    browser.call("Page.navigate", {"url": url})
    browser.wait(ready)
    return browser, ""


@contextmanager
def page_or_skip(url: str, ready: str, *, width: int = 1400, height: int = 1800) -> Iterator[Browser]:
    """`served_page` for a test: the Browser, closed when the block ends; the test is skipped, with the reason, where
    there is no Chromium."""
    import pytest

    browser, reason = served_page(url, ready, width=width, height=height)
    if browser is None:
        pytest.skip(f"no headless browser: {reason}")
    try:
        yield browser
    finally:
        browser.close()


def check_colour_bar(ticks: list[dict], top: float, height: float, largest: float) -> None:
    """A colour bar's ticks (serve/static/colour_bar.js) as the pages record them: round weights from 0, each printed
    as it is, the top labelled with the map's largest weight to three figures, each drawn at
    y = top + (1 - value / largest) * (height - 1), and their 14 px labels apart."""
    import pytest

    assert len(ticks) >= 3 and ticks[0]["label"] == "0", ticks
    *round_ticks, highest = ticks
    for tick in round_ticks:
        assert float(tick["label"]) == pytest.approx(tick["value"], abs=1e-9)
    assert highest["value"] == pytest.approx(largest, rel=1e-6)
    assert float(highest["label"]) == pytest.approx(float(f"{largest:.3g}"), rel=1e-9), (highest, largest)
    for tick in ticks:
        assert tick["y"] == pytest.approx(top + (1 - tick["value"] / largest) * (height - 1), abs=1e-3)
    assert min(a["y"] - b["y"] for a, b in zip(ticks, ticks[1:], strict=False)) >= 18, ticks
