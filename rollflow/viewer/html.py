"""HTML pieces of the trajectory viewer: escaping, colours, token strips, tables, SVG line charts, the page.

What it is: pure functions from plain values to HTML strings; every value that reaches the page goes
through ``esc`` (model text is untrusted: a completion may hold ``<script>``). The pages carry no
JavaScript at all, and the server sends a Content-Security-Policy that forbids scripts, so a missed
escape still could not run code.

Colours (hand-checkable):

    version_colour(v)  = hsl(240 - 240 * (v - vmin) / (vmax - vmin), 75%, 82%)   blue (oldest) -> red (newest)
                         prompt / environment tokens (v = -1): grey #e6e6e6
    logprob_colour(lp) = hsl(120 * exp(lp), 70%, 80%)   red (p = 0) -> yellow (p = 0.5) -> green (p = 1)

Example: with versions 10..20, a token of v15 is hsl(120, 75%, 82%) (green, the middle); a token of
logprob log(0.5) is hsl(60, 70%, 80%).

What it is not: data access (``pages``) or HTTP (``server``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

PROMPT_GREY = "#e6e6e6"

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 18px 0 6px; }
nav a { margin-right: 14px; } .muted { color: #777; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
td.text { text-align: left; font-family: ui-monospace, monospace; white-space: pre-wrap; max-width: 46em;
  overflow-wrap: anywhere; }
.strip { font-family: ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; line-height: 1.9;
  border: 1px solid #ddd; padding: 6px; max-width: 70em; }
.strip span { padding: 1px 0; border-radius: 2px; box-shadow: inset -1px 0 rgba(0, 0, 0, 0.18); }
.legend span { display: inline-block; padding: 0 6px; margin-right: 2px; font-size: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
form.filters input { width: 7em; } form.filters label { margin-right: 10px; }
.ok { color: #0a6b2a; } .bad { color: #a31515; }
"""


def esc(value: object) -> str:
    """Text (anything) -> HTML-safe text: ``& < > " '`` become entities."""
    return html.escape(str(value), quote=True)


def fmt(value: object, digits: int = 3) -> str:
    """A number for a table cell (NULL -> an em dash); text is escaped."""
    if value is None:
        return "\u2014"
    if isinstance(value, float):
        if math.isnan(value):
            return "\u2014"
        return f"{value:.{digits}f}"
    return esc(value)


def version_colour(version: int, vmin: int, vmax: int) -> str:
    """Background of a token made by ``version`` (module docstring); -1 (not the policy's) is grey."""
    if version < 0:
        return PROMPT_GREY
    span = max(1, vmax - vmin)
    x = min(1.0, max(0.0, (version - vmin) / span))
    return f"hsl({240 - 240 * x:.0f}, 75%, 82%)"


def logprob_colour(logprob: float) -> str:
    """Background of a token by its behaviour probability ``exp(logprob)`` (module docstring)."""
    p = min(1.0, max(0.0, math.exp(logprob))) if math.isfinite(logprob) else 0.0
    return f"hsl({120 * p:.0f}, 70%, 80%)"


@dataclass(frozen=True)
class Token:
    """One token as shown: its text piece, id, policy version (-1: prompt/env), behaviour logprob, loss flag."""

    text: str
    token_id: int
    version: int
    logprob: float
    trained: bool


def token_strip(tokens: Sequence[Token], *, by: str, vmin: int, vmax: int) -> str:
    """The tokens as coloured spans (``by`` = "version" or "logprob"), each with a tooltip of its numbers."""
    out = []
    for t in tokens:
        if by == "version":
            colour = version_colour(t.version, vmin, vmax)
        else:
            colour = logprob_colour(t.logprob) if t.trained else PROMPT_GREY
        tip = f"id {t.token_id} | " + (
            f"v{t.version} | logprob {t.logprob:.3f}" if t.trained else "prompt/env"
        )
        out.append(f'<span style="background:{colour}" title="{esc(tip)}">{esc(t.text)}</span>')
    return f'<div class="strip">{"".join(out)}</div>'


def version_legend(vmin: int, vmax: int) -> str:
    steps = sorted({vmin, (vmin + vmax) // 2, vmax})
    cells = [f'<span style="background:{PROMPT_GREY}">prompt/env</span>']
    cells += [f'<span style="background:{version_colour(v, vmin, vmax)}">v{v}</span>' for v in steps]
    return f'<div class="legend">{"".join(cells)}</div>'


def logprob_legend() -> str:
    probs = (0.0, 0.25, 0.5, 0.75, 1.0)
    cells = [
        f'<span style="background:{logprob_colour(math.log(p) if p else -math.inf)}">p={p}</span>'
        for p in probs
    ]
    return f'<div class="legend">{"".join(cells)}</div>'


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: Sequence[int] = ()) -> str:
    """A table; header names are escaped here, cells must already be HTML (use ``esc``/``fmt``)."""
    left_set = set(left)

    def cls(i: int) -> str:
        return ' class="l"' if i in left_set else ""

    head = "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def line_chart(
    xs: Sequence[float], ys: Sequence[float | None], *, title: str, width: int = 360, height: int = 150
) -> str:
    """A small SVG line chart of ``ys`` over ``xs`` (None points are skipped), with its min/max labelled."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None and math.isfinite(y)]
    pad_l, pad_r, pad_t, pad_b = 44, 8, 20, 20
    head = f'<svg width="{width}" height="{height}" role="img" aria-label="{esc(title)}"><text x="{pad_l}" y="13" font-size="12">{esc(title)}</text>'
    if not pts:
        return head + f'<text x="{pad_l}" y="{height // 2}" font-size="12" fill="#777">no data</text></svg>'
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    xspan, yspan = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def px(x: float, y: float) -> str:
        return f"{pad_l + (x - x0) / xspan * w:.1f},{pad_t + h - (y - y0) / yspan * h:.1f}"

    poly = " ".join(px(x, y) for x, y in pts)
    return (
        head
        + f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>'
        + f'<polyline points="{poly}" fill="none" stroke="#1f5fbf" stroke-width="1.5"/>'
        + f'<text x="{pad_l - 4}" y="{pad_t + 9}" font-size="10" text-anchor="end">{y1:.3g}</text>'
        + f'<text x="{pad_l - 4}" y="{pad_t + h}" font-size="10" text-anchor="end">{y0:.3g}</text>'
        + f'<text x="{pad_l}" y="{height - 5}" font-size="10">v{x0:.0f}</text>'
        + f'<text x="{width - pad_r}" y="{height - 5}" font-size="10" text-anchor="end">v{x1:.0f}</text>'
        + "</svg>"
    )


def page(title: str, body: str, *, nav: str = "") -> str:
    """A whole HTML document (no scripts)."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
        f"{nav}<h1>{esc(title)}</h1>{body}</body></html>"
    )
