"""Table cells and number formats of the report (HTML text, escaped)."""

from __future__ import annotations

import html
import math
from typing import Any


def fmt(value: Any, unit: str = "") -> str:
    """A number (3 significant digits, thousands separated), a flag or text; — for None."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return "∞"
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
        return html.escape(text + unit)
    return html.escape(str(value))


def pct(value: Any) -> str:
    """A share as a percentage with one decimal."""
    return "—" if value is None else f"{value:.1%}"


def table(headers: list[str], rows: list[list[str]], *, drop_empty: bool = False) -> str:
    """A table; a cell already written as ``<td ...>`` is kept as it is. ``drop_empty``
    leaves out the columns that hold no figure in any row (all "—")."""
    if drop_empty and rows:
        kept = [i for i in range(len(headers)) if any(row[i] != "—" for row in rows)]
        headers = [headers[i] for i in kept]
        rows = [[row[i] for i in kept] for row in rows]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(content: str) -> str:
    if content.startswith("<td"):
        return content
    return f"<td>{content}</td>"


def heat(value: float | None, bad: float, good: float, text: str) -> str:
    """A table cell coloured from red (at ``bad``) to green (at ``good``)."""
    if value is None or not math.isfinite(value) or good == bad:
        return f"<td>{text}</td>"
    share = min(1.0, max(0.0, (value - bad) / (good - bad)))
    return f'<td style="background:hsl({share * 120:.0f},70%,86%)">{text}</td>'


def seconds(v: float) -> str:
    """An axis tick in seconds."""
    return f"{v:g}"


def share(v: float) -> str:
    """An axis tick as a percentage."""
    return f"{v:.0%}"
