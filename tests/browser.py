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

# Each text of each plot as the quadrilateral it covers on screen (its box through its
# transform: the bar charts' slanted labels are rotated), and the pairs that overlap by
# more than a pixel, by the separating-axis test of two convex quadrilaterals.
_OVERLAPS = """() => {
  const quad = t => {
    const b = t.getBBox(), m = t.getScreenCTM();
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height],
            [b.x, b.y + b.height]].map(([x, y]) => [m.a * x + m.c * y + m.e,
                                                     m.b * x + m.d * y + m.f]);
  };
  const separated = (p, q) => {
    for (const poly of [p, q]) {
      for (let i = 0; i < 4; i++) {
        const [x1, y1] = poly[i], [x2, y2] = poly[(i + 1) % 4];
        const nx = y2 - y1, ny = x1 - x2, len = Math.hypot(nx, ny) || 1;
        const proj = r => r.map(([x, y]) => (x * nx + y * ny) / len);
        const a = proj(p), c = proj(q);
        if (Math.max(...a) <= Math.min(...c) + 1 || Math.max(...c) <= Math.min(...a) + 1)
          return true;
      }
    }
    return false;
  };
  const found = [];
  for (const svg of document.querySelectorAll('svg.plot')) {
    const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim());
    const quads = texts.map(quad);
    for (let i = 0; i < texts.length; i++)
      for (let j = i + 1; j < texts.length; j++)
        if (!separated(quads[i], quads[j]))
          found.push(`${svg.dataset.plot}: "${texts[i].textContent}" / "${texts[j].textContent}"`);
  }
  return found;
}"""

_TABLES = """() => [...document.querySelectorAll('table')].map(t => {
  let title = t.caption ? t.caption.textContent : '';
  for (let e = t.previousElementSibling; !title && e; e = e.previousElementSibling)
    if (/^H[1-6]$/.test(e.tagName)) title = e.textContent;
  const head = t.tHead ? t.tHead.rows[0] : t.rows[0];
  const body = t.tBodies.length ? [...t.tBodies[0].rows] : [];
  return {title, columns: head ? [...head.cells].map(c => c.textContent.trim()) : [],
          rows: body.map(r => [...r.cells].map(c => c.textContent.trim()))};
})"""


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
    overlaps: list[str] = field(default_factory=list)
    """Pairs of text labels of one plot whose drawn boxes (rotation included) overlap."""
    tables: list[dict[str, Any]] = field(default_factory=list)
    """Each table's caption or preceding heading, its column headers and its body rows
    (each cell's text)."""

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
            seen.overlaps = page.evaluate(_OVERLAPS)
            seen.tables = page.evaluate(_TABLES)
            page.screenshot(path=str(screenshot), full_page=True)
            if extra_shot is not None:
                page.screenshot(path=str(extra_shot[0]), clip=extra_shot[1], full_page=True)
        finally:
            browser.close()
    return seen
