"""Headless Chromium for the dashboard tests: a page's screenshot, its DOM after scripts ran, and
every URL it asked for, read from Chromium's net log.

Chromium runs with every host name but 127.0.0.1 resolving to nothing, so a page that needed the
internet would render without it; the net log shows what the page tried all the same. The
browser's own background traffic (update checks, account probes) is told apart from the page's
by the network isolation key: the page's requests carry its site, the browser's do not.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")
OFFLINE = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def find_chromium() -> str | None:
    """The Chromium on ``PATH``, or ``None``."""
    return next((found for name in NAMES if (found := shutil.which(name))), None)


@dataclass(frozen=True)
class Visit:
    """What loading one URL gave: the DOM, the screenshot and the URLs the page requested."""

    dom: str
    screenshot: Path
    requests: list[str]
    log: str  # Chromium's stderr

    @property
    def console(self) -> list[str]:
        """What the page logged to the console: errors, and resources a CSP refused."""
        return [line for line in self.log.splitlines() if ":CONSOLE" in line]


def page_requests(net_log: Path, site: str) -> list[str]:
    """Every URL the page on ``site`` (``http://127.0.0.1``) requested: the document, its
    subresources and frames, whatever host they name."""
    log: dict[str, Any] = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        event["params"]["url"]
        for event in log["events"]
        if event["type"] == start
        and "params" in event
        and str(event["params"].get("network_isolation_key", "")).startswith(site)
    ]


def visit(
    chromium: str, url: str, out: Path, name: str, *, site: str = "http://127.0.0.1"
) -> Visit:
    """Loads ``url`` in a fresh headless Chromium, offline but for 127.0.0.1, 1280×900.

    Writes ``out/<name>.png`` and ``out/<name>.netlog.json``; gives scripts up to 10 s of
    virtual time to finish (Swagger UI fetches the OpenAPI document, then renders).
    """
    out.mkdir(parents=True, exist_ok=True)
    screenshot, net_log = out / f"{name}.png", out / f"{name}.netlog.json"
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--window-size=1280,900", f"--screenshot={screenshot}", "--dump-dom",
        f"--log-net-log={net_log}", f"--host-resolver-rules={OFFLINE}",
        "--virtual-time-budget=10000", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--no-default-browser-check",
        "--enable-logging=stderr", "--v=0", f"--user-data-dir={out / f'{name}.profile'}", url,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 or not screenshot.exists():
        raise RuntimeError(f"chromium exited {done.returncode} on {url}: {done.stderr[-2000:]}")
    shutil.rmtree(out / f"{name}.profile", ignore_errors=True)
    return Visit(done.stdout, screenshot, page_requests(net_log, site), done.stderr)
