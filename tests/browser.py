"""Open a self-contained HTML report in headless Chromium (the system's, via playwright;
no browser download) and read what it drew: console errors, every request it made, and
each ``svg.plot`` with its size and drawn marks. Under ``CI=true`` a missing Chromium or
playwright fails the test; elsewhere it skips."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

__all__ = ["Opened", "open_report"]


def _need(found: bool, what: str) -> None:
    if not found:
        message = f"{what} is missing (CI installs it: apt-get install -y chromium; pip)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class Opened:
    """What Chromium saw."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    plots: list[dict[str, Any]] = field(default_factory=list)

    def empty_plots(self) -> list[str]:
        """Plots with no size or no drawn series."""
        return [
            p["name"] for p in self.plots if not (p["width"] > 0 and p["height"] > 0 and p["marks"])
        ]


def open_report(
    path: Path, screenshot: Path, extra_shot: tuple[Path, dict[str, int]] | None = None
) -> Opened:
    """Load ``path``, read its plots, and save a full-page screenshot to ``screenshot``
    (and a clip of it to ``extra_shot``'s path when given)."""
    _need(CHROMIUM.exists(), str(CHROMIUM))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need(False, "the playwright package")
        raise
    seen = Opened()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen.errors.append(str(e)))
            page.on("request", lambda r: seen.requests.append(r.url))
            page.goto(path.as_uri(), wait_until="load")
            seen.plots = page.evaluate(
                """() => [...document.querySelectorAll('svg.plot')].map(s => {
                    const marks = [...s.querySelectorAll('.series')].map(e => e.getBBox());
                    const r = s.getBoundingClientRect();
                    return {name: s.dataset.plot, width: r.width, height: r.height,
                            marks: marks.filter(b => b.width > 0 || b.height > 0).length};
                })"""
            )
            page.screenshot(path=str(screenshot), full_page=True)
            if extra_shot is not None:
                page.screenshot(path=str(extra_shot[0]), clip=extra_shot[1], full_page=True)
        finally:
            browser.close()
    return seen
