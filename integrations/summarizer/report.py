"""The demo's report: ``report.json`` (everything measured) and a self-contained ``report.html``.

The HTML page has no external assets: charts are inline SVG drawn here, styles are
inline, there is no script. Each chart puts the naive run and the resilient run side by
side on the same scales, with the fault windows shaded:

* API latency p50 / p95 / p99 per second (log scale, the 300 ms SLO dashed)
* first-token latency per job (the 500 ms SLO dashed)
* downloads in flight, as counted by the platforms themselves, per domain (stacked)
* circuit-breaker states over time (one lane per breaker)
* outcomes per phase (full / degraded / failed)

Example::

    html_path = write_report(document, Path("out"))
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .analysis import SLO, percentile, recovery_text

__all__ = ["render_html", "write_report"]

_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
_STATE_COLORS = {
    "closed": "#8fd19e",
    "open": "#e45756",
    "half_open": "#f2b701",
    "forced_open": "#b10026",
    "disabled": "#cccccc",
    "metrics_only": "#cccccc",
}
_OUTCOME_COLORS = {"full": "#4c9f70", "degraded": "#f2b701", "failed": "#e45756"}


def write_report(document: dict[str, Any], out: Path) -> Path:
    """Write ``report.json`` and ``report.html`` into ``out``; return the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(document, indent=1, default=str))
    path = out / "report.html"
    path.write_text(render_html(document))
    return path


# -- SVG primitives -------------------------------------------------------------------


class _Frame:
    """A chart area: maps data coordinates to pixels."""

    def __init__(
        self,
        width: float,
        height: float,
        x_range: tuple[float, float],
        y_range: tuple[float, float],
        *,
        log: bool = False,
        left: float = 52,
        right: float = 10,
        top: float = 26,
        bottom: float = 28,
    ) -> None:
        self.width, self.height = width, height
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        self.log = log
        self.left, self.right, self.top, self.bottom = left, right, top, bottom

    def x(self, value: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return self.left + (value - self.x0) / span * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        if self.log:
            lo, hi = math.log10(self.y0), math.log10(self.y1)
            v = math.log10(min(max(value, self.y0), self.y1))
        else:
            lo, hi, v = self.y0, self.y1, min(max(value, self.y0), self.y1)
        span = (hi - lo) or 1.0
        return self.height - self.bottom - (v - lo) / span * (self.height - self.top - self.bottom)


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _axes(
    f: _Frame, title: str, y_label: str, y_ticks: Sequence[float], fmt: str = "{:g}"
) -> list[str]:
    parts = [
        f'<text x="{f.left}" y="16" class="ct">{_esc(title)}</text>',
        f'<line x1="{f.left}" y1="{f.y(f.y0)}" x2="{f.width - f.right}" '
        f'y2="{f.y(f.y0)}" class="ax"/>',
        f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{f.y(f.y0)}" class="ax"/>',
        f'<text x="10" y="{(f.top + f.height - f.bottom) / 2}" class="yl" '
        f'transform="rotate(-90 10 {(f.top + f.height - f.bottom) / 2})">{_esc(y_label)}</text>',
    ]
    for tick in y_ticks:
        y = f.y(tick)
        parts.append(
            f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.width - f.right}" y2="{y:.1f}" class="gr"/>'
        )
        parts.append(
            f'<text x="{f.left - 4}" y="{y + 3:.1f}" class="tk" text-anchor="end">'
            f"{fmt.format(tick)}</text>"
        )
    step = _nice_step(f.x1 - f.x0, 8)
    t = 0.0
    while t <= f.x1 + 1e-9:
        if t >= f.x0:
            x = f.x(t)
            parts.append(
                f'<text x="{x:.1f}" y="{f.height - 10}" class="tk" '
                f'text-anchor="middle">{t:g}s</text>'
            )
        t += step
    return parts


def _nice_step(span: float, count: int) -> float:
    raw = max(span / max(count, 1), 1e-9)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * magnitude:
            return m * magnitude
    return 10 * magnitude


def _bands(f: _Frame, phases: list[dict[str, Any]], *, labels: bool = True) -> list[str]:
    parts = []
    shown = 0
    for p in phases:
        if not p.get("faults"):
            continue
        shown += 1
        label_y = f.top + (10 if shown % 2 else 20)  # staggered: short phases sit side by side
        x0, x1 = f.x(p["start"]), f.x(p["end"])
        parts.append(
            f'<rect x="{x0:.1f}" y="{f.top}" width="{max(1.0, x1 - x0):.1f}" '
            f'height="{f.y(f.y0) - f.top:.1f}" class="band">'
            f"<title>{_esc(p['description'])}</title></rect>"
        )
        if not labels:
            continue
        parts.append(
            f'<text x="{(x0 + x1) / 2:.1f}" y="{label_y}" class="bl" text-anchor="middle">'
            f"{_esc(p['name'].replace('_', ' '))}</text>"
        )
    return parts


def _svg(f: _Frame, parts: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" style="max-width:{f.width:.0f}px" '
        f'viewBox="0 0 {f.width:.0f} {f.height:.0f}" role="img" aria-label="{_esc(label)}">'
        + "".join(parts)
        + "</svg>"
    )


def _polyline(f: _Frame, points: list[tuple[float, float]], color: str, width: float = 1.6) -> str:
    if not points:
        return ""
    coords = " ".join(f"{f.x(x):.1f},{f.y(y):.1f}" for x, y in points)
    return f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="{width}"/>'


def _legend(f: _Frame, names: Sequence[str], colors: Sequence[str]) -> list[str]:
    parts = []
    x = f.width - f.right - 8
    for name, color in reversed(list(zip(names, colors))):
        w = 9 + 6.2 * len(name)
        x -= w + 10
        parts.append(f'<rect x="{x:.0f}" y="8" width="9" height="9" fill="{color}"/>')
        parts.append(f'<text x="{x + 12:.0f}" y="16" class="tk">{_esc(name)}</text>')
    return parts


def _threshold(f: _Frame, value: float, label: str) -> list[str]:
    y = f.y(value)
    return [
        f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.width - f.right}" y2="{y:.1f}" class="slo"/>',
        f'<text x="{f.width - f.right - 2}" y="{y - 3:.1f}" class="sl" '
        f'text-anchor="end">{_esc(label)}</text>',
    ]


# -- charts ---------------------------------------------------------------------------


def _run_span(run: dict[str, Any]) -> float:
    rec = run["recorder"]
    ends = [p["end"] for p in rec["phases"]] + [s["t"] for s in rec["samples"][-1:]]
    return max(ends, default=1.0)


def _latency_series(run: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    buckets: dict[int, list[float]] = {}
    for a in run["recorder"]["api"]:
        buckets.setdefault(int(a["t"]), []).append(a["latency"] * 1000.0)
    out: dict[str, list[tuple[float, float]]] = {"p50": [], "p95": [], "p99": []}
    for second in sorted(buckets):
        values = buckets[second]
        for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            value = percentile(values, q)
            if value is not None:
                out[name].append((second + 0.5, value))
    return out


def latency_chart(run: dict[str, Any], span: float, y_max: float, width: float = 520) -> str:
    """API latency percentiles per second (log scale), fault windows shaded."""
    f = _Frame(width, 230, (0.0, span), (1.0, y_max), log=True)
    ticks = [t for t in (1, 3, 10, 30, 100, 300, 1000, 3000, 10000, 30000) if t <= y_max]
    parts = _axes(f, f"API latency - {run['mode']}", "ms (log)", ticks)
    parts += _bands(f, run["recorder"]["phases"])
    series = _latency_series(run)
    colors = ["#4c78a8", "#f58518", "#e45756"]
    for points, color in zip(series.values(), colors):
        parts.append(_polyline(f, points, color))
    parts += _threshold(f, SLO["api_p99_ms"], "p99 SLO 300 ms")
    parts += _legend(f, list(series), colors)
    return _svg(f, parts, f"API latency percentiles over time, {run['mode']} run")


def first_token_chart(run: dict[str, Any], span: float, y_max: float, width: float = 520) -> str:
    """First-token latency of each job (dots) and its p95 per 2 s (line)."""
    f = _Frame(width, 230, (0.0, span), (0.0, y_max))
    step = _nice_step(y_max, 5)
    ticks = [i * step for i in range(int(y_max / step) + 1)]
    parts = _axes(f, f"first-token latency - {run['mode']}", "ms", ticks)
    parts += _bands(f, run["recorder"]["phases"])
    buckets: dict[int, list[float]] = {}
    dots = []
    for j in run["recorder"]["jobs"]:
        if j["first_token"] is None:
            continue
        ms = j["first_token"] * 1000.0
        at = j.get("inference_t") or j["t"]  # when the model was asked
        dots.append(f'<circle cx="{f.x(at):.1f}" cy="{f.y(ms):.1f}" r="1.3" class="dot"/>')
        buckets.setdefault(int(at // 2), []).append(ms)
    parts += dots
    p95 = [(k * 2 + 1.0, percentile(v, 0.95) or 0.0) for k, v in sorted(buckets.items())]
    parts.append(_polyline(f, p95, "#e45756", 2.0))
    parts += _threshold(f, SLO["first_token_p95_ms"], "p95 SLO 500 ms")
    parts += _legend(f, ["job", "p95 / 2 s"], ["#9ecae9", "#e45756"])
    return _svg(f, parts, f"first-token latency over time, {run['mode']} run")


def downloads_chart(run: dict[str, Any], span: float, y_max: float, width: float = 520) -> str:
    """Downloads in flight per domain (stacked), counted by the platforms."""
    f = _Frame(width, 230, (0.0, span), (0.0, y_max))
    step = _nice_step(y_max, 5)
    ticks = [i * step for i in range(int(y_max / step) + 1)]
    parts = _axes(f, f"downloads in flight - {run['mode']}", "in flight", ticks, "{:.0f}")
    parts += _bands(f, run["recorder"]["phases"])
    samples = [s for s in run["recorder"]["samples"] if "platforms" in s]
    domains = sorted({d for s in samples for d in s["platforms"]})
    base = [0.0] * len(samples)
    for i, domain in enumerate(domains):
        top = [b + s["platforms"].get(domain, {}).get("inflight", 0) for b, s in zip(base, samples)]
        upper = [(s["t"], v) for s, v in zip(samples, top)]
        lower = [(s["t"], v) for s, v in zip(samples, base)]
        if upper:
            coords = " ".join(f"{f.x(x):.1f},{f.y(y):.1f}" for x, y in upper + lower[::-1])
            parts.append(
                f'<polygon points="{coords}" fill="{_COLORS[i % len(_COLORS)]}" '
                'fill-opacity="0.75"/>'
            )
        base = top
    parts += _threshold(f, SLO["concurrent_downloads"], "target 300")
    parts += _legend(f, [d.split(".")[0] for d in domains], _COLORS[: len(domains)])
    return _svg(f, parts, f"downloads in flight over time, {run['mode']} run")


def breaker_chart(run: dict[str, Any], span: float, width: float = 520) -> str:
    """One lane per breaker; colour = state (worst across workers) at each sample."""
    samples = [s for s in run["recorder"]["samples"] if s.get("workers")]
    names = sorted({k for s in samples for w in s["workers"] for k in w.get("breakers", {})})
    lanes = max(1, len(names))
    height = 40 + 18 * lanes + 24
    f = _Frame(width, height, (0.0, span), (0.0, 1.0), left=128)
    parts = [f'<text x="{f.left}" y="16" class="ct">circuit breakers - {_esc(run["mode"])}</text>']
    parts += _bands(f, run["recorder"]["phases"], labels=False)
    if not names:
        parts.append(
            f'<text x="{f.left + 8}" y="{f.top + 24}" class="tk">no breakers in this run '
            "(naive: policies off)</text>"
        )
    rank = {"closed": 0, "half_open": 1, "open": 2, "forced_open": 3}
    for lane, name in enumerate(names):
        y = f.top + 6 + lane * 18
        parts.append(
            f'<text x="{f.left - 6}" y="{y + 11}" class="tk" text-anchor="end">{_esc(name)}</text>'
        )
        for a, b in zip(samples, [*samples[1:], None]):
            states = [w.get("breakers", {}).get(name, "closed") for w in a["workers"]]
            state = max(states, key=lambda s: rank.get(s, 0))
            x0 = f.x(a["t"])
            x1 = f.x(b["t"]) if b is not None else x0 + 2
            parts.append(
                f'<rect x="{x0:.1f}" y="{y}" width="{max(0.8, x1 - x0):.1f}" height="14" '
                f'fill="{_STATE_COLORS.get(state, "#999")}"/>'
            )
    parts += _legend(
        f,
        ["closed", "half-open", "open"],
        [_STATE_COLORS[k] for k in ("closed", "half_open", "open")],
    )
    step = _nice_step(span, 8)
    t = 0.0
    while t <= span:
        parts.append(
            f'<text x="{f.x(t):.1f}" y="{height - 8}" class="tk" text-anchor="middle">{t:g}s</text>'
        )
        t += step
    return _svg(f, parts, f"circuit breaker states over time, {run['mode']} run")


def outcomes_chart(result: dict[str, Any], y_max: float, width: float = 520) -> str:
    """Stacked bars of full / degraded / failed jobs per phase."""
    phases = result["phases"]
    f = _Frame(width, 230, (0.0, float(max(1, len(phases)))), (0.0, y_max), bottom=44)
    step = _nice_step(y_max, 5)
    ticks = [i * step for i in range(int(y_max / step) + 1)]
    parts = [
        f'<text x="{f.left}" y="16" class="ct">'
        f"job outcomes per phase - {_esc(result['mode'])}</text>"
    ]
    for tick in ticks:
        y = f.y(tick)
        parts.append(
            f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.width - f.right}" y2="{y:.1f}" class="gr"/>'
        )
        parts.append(
            f'<text x="{f.left - 4}" y="{y + 3:.1f}" class="tk" text-anchor="end">{tick:.0f}</text>'
        )
    for i, p in enumerate(phases):
        x0, x1 = f.x(i + 0.15), f.x(i + 0.85)
        base = 0.0
        for outcome in ("full", "degraded", "failed"):
            n = p[outcome]
            if n:
                y_top, y_bottom = f.y(base + n), f.y(base)
                parts.append(
                    f'<rect x="{x0:.1f}" y="{y_top:.1f}" width="{x1 - x0:.1f}" '
                    f'height="{y_bottom - y_top:.1f}" fill="{_OUTCOME_COLORS[outcome]}">'
                    f"<title>{_esc(p['name'])}: {n} {outcome}</title></rect>"
                )
            base += n
        parts.append(
            f'<text x="{(x0 + x1) / 2:.1f}" y="{f.height - 30}" class="tk" text-anchor="middle">'
            f"{_esc(p['name'].replace('_', ' '))}</text>"
        )
    parts += _legend(f, list(_OUTCOME_COLORS), list(_OUTCOME_COLORS.values()))
    return _svg(f, parts, f"job outcomes per phase, {result['mode']} run")


# -- the page -------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1120px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.sub{color:#666;margin:0 0 16px}.pair{display:flex;gap:12px;flex-wrap:wrap}
.pair>div{flex:1 1 460px;min-width:0}table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f6f6f6}
.ok{color:#2b7a3d;font-weight:600}.bad{color:#c0392b;font-weight:600}
.ct{font-size:13px;font-weight:600;fill:#222}.tk{font-size:10px;fill:#555}
.yl{font-size:10px;fill:#555;text-anchor:middle}.ax{stroke:#999;stroke-width:1}
.gr{stroke:#eee;stroke-width:1}.band{fill:#e45756;fill-opacity:.09}
.bl{font-size:9px;fill:#b03a2e}.slo{stroke:#c0392b;stroke-dasharray:5 4;stroke-width:1}
.sl{font-size:9px;fill:#c0392b}.dot{fill:#9ecae9;fill-opacity:.8}
.head td{font-size:14px}.note{color:#666;font-size:12px}td.l{text-align:left}
"""


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return (f"{value:.0f}" if abs(value) >= 10 else f"{value:.2g}") + unit
    return f"{value}{unit}"


def _headline(results: dict[str, Any]) -> str:
    def worst(result: dict[str, Any], key: str) -> float | None:
        values = [p[key] for p in result["phases"] if p[key] is not None]
        return max(values) if values else None

    def recovery(result: dict[str, Any]) -> str:
        values = [
            r.get("seconds")
            for p in result["phases"]
            for r in p["recovery"].values()
            if not r.get("unused")
        ]
        if not values:
            return "-"
        if any(v is None for v in values):
            return "not within the run"
        return f"{max(values):.1f} s (worst)"

    rows = [
        ("first-token latency (p95, worst phase)", "1.2 s", "< 0.5 s", "first_token_p95_ms", " ms"),
        ("concurrent downloads (steady, sustained)", "80", ">= 300", None, ""),
        ("API P99 (worst phase)", "850 ms", "< 300 ms", "api_p99_ms", " ms"),
    ]
    body = []
    for label, before, target, key, unit in rows:
        cells = []
        for mode in ("naive", "resilient"):
            r = results.get(mode)
            if r is None:
                cells.append("-")
            elif key is None:
                cells.append(str(r["phases"][0]["sustained_downloads"]) if r["phases"] else "-")
            else:
                cells.append(_fmt(worst(r, key), unit))
        body.append(
            f"<tr><td>{_esc(label)}</td><td>{before}</td><td>{_esc(target)}</td>"
            f"<td>{cells[0]}</td><td><b>{cells[1]}</b></td></tr>"
        )
    cells = [recovery(results[m]) if m in results else "-" for m in ("naive", "resilient")]
    body.append(
        "<tr><td>fault recovery</td><td>manual (~20 min)</td>"
        "<td>automatic, &lt; 60 s (ours &lt; 5 s)</td>"
        f"<td>{_esc(cells[0])}</td><td><b>{_esc(cells[1])}</b></td></tr>"
    )
    failed = [
        str(results[m]["totals"]["failed"]) if m in results else "-" for m in ("naive", "resilient")
    ]
    body.append(
        f"<tr><td>failed jobs (whole run)</td><td>-</td><td>0</td><td>{failed[0]}</td>"
        f"<td><b>{failed[1]}</b></td></tr>"
    )
    return (
        '<table class="head"><tr><th>metric</th><th>seed: before</th><th>seed: target</th>'
        "<th>naive (measured)</th><th>resilient (measured)</th></tr>" + "".join(body) + "</table>"
    )


def _phase_table(result: dict[str, Any]) -> str:
    head = (
        "<tr><th>phase</th><th>requests</th><th>full</th><th>degraded</th><th>failed</th>"
        "<th>API p50</th><th>p95</th><th>p99</th><th>1st token p50</th><th>p95</th>"
        "<th>peak downloads</th><th>breaker transitions</th><th>recovery after clear</th></tr>"
    )
    rows = []
    for p in result["phases"]:
        recovery = ", ".join(
            f"{k.split(':', 1)[1]}: {recovery_text(v)}" for k, v in p["recovery"].items()
        )
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{_esc(c)}</td>"
                for c in (
                    p["name"],
                    p["requests"],
                    p["full"],
                    p["degraded"],
                    p["failed"],
                    _fmt(p["api_p50_ms"], " ms"),
                    _fmt(p["api_p95_ms"], " ms"),
                    _fmt(p["api_p99_ms"], " ms"),
                    _fmt(p["first_token_p50_ms"], " ms"),
                    _fmt(p["first_token_p95_ms"], " ms"),
                    p["peak_downloads"],
                    p["breaker_transitions"],
                    recovery or "-",
                )
            )
            + "</tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _slo_table(slos: list[dict[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{_esc(s['slo'])}</td><td>{_esc(s['target'])}</td><td>{_esc(_fmt(s['measured']))}</td>"
        f'<td class="{"ok" if s["ok"] else "bad"}">{"met" if s["ok"] else "MISSED"}</td></tr>'
        for s in slos
    )
    return f"<table><tr><th>SLO</th><th>target</th><th>measured</th><th></th></tr>{rows}</table>"


def render_html(document: dict[str, Any]) -> str:
    """The whole report page as one self-contained HTML string."""
    runs: dict[str, Any] = document["runs"]
    results: dict[str, Any] = document["results"]
    modes = [m for m in ("naive", "resilient") if m in runs]
    span = max((_run_span(runs[m]) for m in modes), default=1.0)
    api_max = max(
        (a["latency"] * 1000.0 for m in modes for a in runs[m]["recorder"]["api"]), default=10.0
    )
    api_max = 10 ** math.ceil(math.log10(max(api_max, 400.0)))
    ft = [
        j["first_token"] * 1000.0
        for m in modes
        for j in runs[m]["recorder"]["jobs"]
        if j["first_token"]
    ]
    ft_max = max(600.0, min(max(ft, default=600.0), 5000.0) * 1.05)
    dl = [
        sum(v["inflight"] for v in s.get("platforms", {}).values())
        for m in modes
        for s in runs[m]["recorder"]["samples"]
    ]
    dl_max = max(350.0, max(dl, default=0) * 1.1)
    jobs_max = max((p["requests"] for m in modes for p in results[m]["phases"]), default=1) * 1.1

    def pair(render: Any) -> str:
        return (
            '<div class="pair">'
            + "".join(f"<div>{render(runs[m])}</div>" for m in modes)
            + "</div>"
        )

    slos = document.get("slos", [])
    verdict = (
        '<p class="ok">The resilient run met every SLO.</p>'
        if slos and document.get("slos_met")
        else ('<p class="bad">The resilient run missed at least one SLO.</p>' if slos else "")
    )
    phase_rows = "".join(
        f"<tr><td>{_esc(p['name'])}</td><td>{p['seconds']:.1f} s</td>"
        f'<td class="l">{_esc(p["description"])}</td></tr>'
        for p in document.get("phases", [])
    )
    options = document.get("options", {})
    sections = [
        "<h1>Summarizer under chaos: naive vs resilient</h1>",
        f'<p class="sub">Same load (seeded, {options.get("rate", "?")} jobs/s, open loop), same '
        "faults, measured end to end on 127.0.0.1. "
        f"Redis: {'yes' if options.get('redis') else 'no'}, "
        f"workers: {options.get('workers', 1)}. Models are simulated and extractive.</p>",
        verdict,
        "<h2>The four numbers of the seed article</h2>",
        _headline(results),
        '<p class="note">Jobs count in the phase in which they were submitted. A naive API '
        "can look fast: its extra work waits behind one global semaphore the API never "
        "sees, and its users pay instead, in late and failed jobs.</p>",
        "<h2>Phases</h2>",
        f"<table><tr><th>phase</th><th>length</th><th>what breaks</th></tr>{phase_rows}</table>",
        "<h2>API latency</h2>",
        pair(lambda r: latency_chart(r, span, api_max)),
        "<h2>First-token latency</h2>",
        pair(lambda r: first_token_chart(r, span, ft_max)),
        "<h2>Downloads in flight (counted by the platforms)</h2>",
        pair(lambda r: downloads_chart(r, span, dl_max)),
        "<h2>Circuit breakers</h2>",
        pair(lambda r: breaker_chart(r, span)),
        "<h2>Outcomes</h2>",
        '<div class="pair">'
        + "".join(f"<div>{outcomes_chart(results[m], jobs_max)}</div>" for m in modes)
        + "</div>",
    ]
    for m in modes:
        sections.append(f"<h2>{_esc(m)} run, per phase</h2>")
        sections.append(_phase_table(results[m]))
        reasons = results[m]["totals"].get("failure_reasons") or {}
        if reasons:
            text = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))
            sections.append(f'<p class="note">why jobs failed: {_esc(text)}</p>')
    if slos:
        sections.append("<h2>SLOs of the resilient run</h2>")
        sections.append(_slo_table(slos))
    sections.append(
        '<p class="note">Recovery: time from the moment a fault was cleared until the end of the '
        "first 0.5 s window, sampled on the upstream side, in which the affected dependency "
        "answered successfully again (at least one success, and at least 90% of its answers "
        "successes). Downloads in flight are counted by the simulated platforms. "
        "Latencies are measured by the virtual users; a first token counts in the phase the "
        "model was asked in.</p>"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<title>Summarizer chaos report</title>"
        f"<style>{_CSS}</style></head><body>" + "\n".join(sections) + "</body></html>\n"
    )
