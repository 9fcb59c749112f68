"""A minimal W3C WebDriver client (standard library HTTP) for Debian's chromium and chromedriver:
open a page, run a script in it, wait for a condition, take a screenshot. (selenium's current release
requires a certifi newer than the package index here holds; this is all we need of it.) Used by
scripts/tools/page_screenshots.py and by the browser tests (tests/integration/node/test_observe_browser.py)."""
from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = None if CHROMIUM and CHROMEDRIVER else (
    "chromium and chromedriver are not installed (scripts/setup.sh installs Debian's chromium and chromium-driver)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless chromium driven through chromedriver; use as a context manager (closes both)."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.session = None
        try:
            self._wait_ready()
            args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--window-size={width},{height}", f"--user-data-dir={self.profile.name}"]
            caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}
            self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            assert self.driver.poll() is None, f"chromedriver exited with {self.driver.returncode}"
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        raise TimeoutError("chromedriver did not start")

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"webdriver {method} {path}: {err.code} {err.read()[:500]!r}") from None

    def _session(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def open(self, url: str) -> None:
        self._session("POST", "/url", {"url": url})

    def run(self, script: str, *args):
        """Runs `script` (a function body: `return ...`) in the page; returns its JSON value."""
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait(self, script: str, what: str, timeout_s: float = 30.0):
        """Polls `script` until it returns something truthy; returns that."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.run(script)
            if value:
                return value
            time.sleep(0.25)
        raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")

    def screenshot(self, path: Path) -> Path:
        Path(path).write_bytes(base64.b64decode(self._session("GET", "/screenshot")))
        return Path(path)

    def close(self) -> None:
        if self.session is not None:
            try:
                self._session("DELETE", "")  # quits chromium
            except (RuntimeError, OSError):
                pass
            self.session = None
        if self.driver.poll() is None:
            self.driver.terminate()
            try:
                self.driver.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                self.driver.wait(timeout=10)
        self.profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
