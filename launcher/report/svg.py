"""Line charts as SVG text, for the report's plots: axes with ticks and units, a grid, lines,
shaded spans, dashed or dotted reference lines, notes, a title and a legend.

The report used matplotlib for PNGs: importing it and setting up its fonts was about 0.8 s of
a `launcher report`'s 1.1 s of CPU, for three charts whose whole vocabulary is this module.
SVG is text: a browser, GitHub's markdown view and any editor show it, and a script can read
the numbers back out of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
DASHES = {"-": "", "--": "6,4", ":": "2,3"}
CHAR_W = 0.6
"""A character's mean width, in units of the font size (for laying out titles and legends)."""


@dataclass
class Line:
    xs: list[float]
    ys: list[float]
    color: str
    label: str | None = None
    width: float = 1.0
    style: str = "-"
    marker: bool = False


@dataclass
class Panel:
    """One set of axes: what is drawn on it, in data units."""

    ylabel: str = ""
    lines: list[Line] = field(default_factory=list)
    spans: list[tuple[float, float, str, str | None]] = field(default_factory=list)
    """(x from, x to, color, legend label): shaded bands across the whole height."""
    hlines: list[Line] = field(default_factory=list)
    vlines: list[Line] = field(default_factory=list)
    """Lines across the whole height (xs = [x]) or width (ys = [y]); their label goes in the legend."""
    notes: list[tuple[float, str, str]] = field(default_factory=list)
    """(x, text, color): written upright beside a vertical line, at the top."""
    y_from_zero: bool = False
    y_top: float | None = None
    legend: str = "lower right"


def nice_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi], at most `most` + 1."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, most)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e7 or abs(v) < 1e-4:
        return f"{v:.1e}"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.6g}"


def _data_range(values: list[float], from_zero: bool, top: float | None) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if from_zero:
        lo = min(0.0, lo)
    if top is not None:
        hi = top
    if hi <= lo:
        pad = abs(hi) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    else:
        pad = (hi - lo) * 0.05
        lo, hi = (lo if from_zero else lo - pad), (hi if top is not None else hi + pad)
    return lo, hi


class Chart:
    """Panels stacked one above the other, sharing the x axis; `render()` is the SVG text."""

    def __init__(
        self,
        title: str,
        xlabel: str,
        panels: list[Panel],
        width: int = 1100,
        panel_height: int = 420,
        integer_x: bool = False,
    ) -> None:
        self.title, self.xlabel, self.panels = title, xlabel, panels
        self.width, self.panel_height, self.integer_x = width, panel_height, integer_x
        self.left, self.right, self.top_pad, self.gap, self.bottom = 90, 30, 22 + 18 * len(title.splitlines()), 40, 60
        self.out: list[str] = []

    def _x_range(self) -> tuple[float, float]:
        xs = [x for p in self.panels for ln in p.lines for x in ln.xs]
        xs += [x for p in self.panels for a, b, _, _ in p.spans for x in (a, b)]
        xs += [x for p in self.panels for ln in p.vlines for x in ln.xs]
        lo, hi = _data_range(xs, False, None)
        return lo, hi

    def render(self) -> str:
        height = self.top_pad + len(self.panels) * self.panel_height + (len(self.panels) - 1) * self.gap + self.bottom
        self.out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{height}" '
            f'viewBox="0 0 {self.width} {height}" {FONT} font-size="12">',
            f'<rect width="{self.width}" height="{height}" fill="white"/>',
        ]
        for i, line in enumerate(self.title.splitlines()):
            self.out.append(
                f'<text x="{self.width / 2:.0f}" y="{20 + 18 * i}" text-anchor="middle" '
                f'font-size="14">{escape(line)}</text>'
            )
        xlo, xhi = self._x_range()
        for i, panel in enumerate(self.panels):
            top = self.top_pad + i * (self.panel_height + self.gap)
            self._panel(panel, top, (xlo, xhi), last=i == len(self.panels) - 1)
        self.out.append("</svg>")
        return "\n".join(self.out) + "\n"

    def _panel(self, p: Panel, top: float, xr: tuple[float, float], last: bool) -> None:
        x0, x1 = self.left, self.width - self.right
        y0, y1 = top + self.panel_height, top
        ys = [y for ln in p.lines for y in ln.ys] + [y for ln in p.hlines for y in ln.ys]
        ylo, yhi = _data_range(ys, p.y_from_zero, p.y_top)

        def px(x: float) -> float:
            return x0 + (x - xr[0]) / (xr[1] - xr[0]) * (x1 - x0)

        def py(y: float) -> float:
            return y0 - (y - ylo) / (yhi - ylo) * (y0 - y1)

        self._axes(p, (x0, y0, x1, y1), xr, (ylo, yhi), px, py, last)
        for a, b, color, _ in p.spans:
            self.out.append(
                f'<rect x="{px(a):.1f}" y="{y1}" width="{max(0.5, px(b) - px(a)):.1f}" '
                f'height="{y0 - y1}" fill="{color}" fill-opacity="0.12"/>'
            )
        for ln in p.vlines:
            self.out.append(self._seg(px(ln.xs[0]), y0, px(ln.xs[0]), y1, ln))
        for ln in p.hlines:
            self.out.append(self._seg(x0, py(ln.ys[0]), x1, py(ln.ys[0]), ln))
        for ln in p.lines:
            self._series(ln, px, py)
        for x, text, color in p.notes:
            self.out.append(
                f'<text transform="translate({px(x) - 4:.1f},{y1 + 6}) rotate(-90)" text-anchor="end" '
                f'font-size="10" fill="{color}">{escape(text)}</text>'
            )  # reads upwards, left of the line
        self._legend(p, (x0, y0, x1, y1))

    def _axes(
        self,
        p: Panel,
        box: tuple[float, float, float, float],
        xr: tuple[float, float],
        yr: tuple[float, float],
        px,
        py,
        last: bool,
    ) -> None:  # noqa: ANN001 - the panel's mappings
        x0, y0, x1, y1 = box
        for t in nice_ticks(*yr):
            if yr[0] <= t <= yr[1]:
                self.out.append(
                    f'<line x1="{x0}" y1="{py(t):.1f}" x2="{x1}" y2="{py(t):.1f}" stroke="#000" stroke-opacity="0.12"/>'
                )
                self.out.append(f'<text x="{x0 - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        xt = [t for t in nice_ticks(*xr) if xr[0] <= t <= xr[1] and (not self.integer_x or float(t).is_integer())]
        for t in xt:
            self.out.append(
                f'<line x1="{px(t):.1f}" y1="{y0}" x2="{px(t):.1f}" y2="{y1}" stroke="#000" stroke-opacity="0.12"/>'
            )
            if last:
                self.out.append(f'<text x="{px(t):.1f}" y="{y0 + 18}" text-anchor="middle">{_fmt(t)}</text>')
        self.out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" stroke="#000"/>')
        cy = (y0 + y1) / 2
        self.out.append(
            f'<text transform="translate({x0 - 62},{cy:.0f}) rotate(-90)" text-anchor="middle">'
            f"{escape(p.ylabel)}</text>"
        )
        if last:
            self.out.append(
                f'<text x="{(x0 + x1) / 2:.0f}" y="{y0 + 42}" text-anchor="middle">{escape(self.xlabel)}</text>'
            )

    @staticmethod
    def _seg(xa: float, ya: float, xb: float, yb: float, ln: Line) -> str:
        dash = DASHES.get(ln.style, "")
        return (
            f'<line x1="{xa:.1f}" y1="{ya:.1f}" x2="{xb:.1f}" y2="{yb:.1f}" stroke="{ln.color}" '
            f'stroke-width="{ln.width}"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>"
        )

    def _series(self, ln: Line, px, py) -> None:  # noqa: ANN001 - the panel's mappings
        pts = [(px(x), py(y)) for x, y in zip(ln.xs, ln.ys) if math.isfinite(x) and math.isfinite(y)]
        if not pts:
            return
        dash = DASHES.get(ln.style, "")
        self.out.append(
            f'<polyline fill="none" stroke="{ln.color}" stroke-width="{ln.width}"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + ' points="'
            + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            + '"/>'
        )
        if ln.marker:
            self.out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{ln.color}"/>' for x, y in pts]

    def _legend(self, p: Panel, box: tuple[float, float, float, float]) -> None:
        entries: list[tuple[str, str, str]] = [
            (ln.color, ln.style, ln.label) for ln in p.lines + p.hlines + p.vlines if ln.label
        ]
        entries += [(color, "span", label) for _, _, color, label in p.spans if label]
        if not entries:
            return
        x0, y0, x1, y1 = box
        n_lines = sum(len(t.splitlines()) for _, _, t in entries)
        w = 40 + CHAR_W * 11 * max(len(line) for _, _, t in entries for line in t.splitlines())
        h = 8 + 15 * n_lines
        lx = x1 - w - 8 if p.legend.endswith("right") else x0 + 8
        ly = y0 - h - 8 if p.legend.startswith("lower") else y1 + 8
        self.out.append(
            f'<rect x="{lx:.1f}" y="{ly:.1f}" width="{w:.1f}" height="{h}" fill="white" '
            f'fill-opacity="0.85" stroke="#ccc"/>'
        )
        y = ly + 15
        for color, style, text in entries:
            if style == "span":
                self.out.append(
                    f'<rect x="{lx + 6:.1f}" y="{y - 9:.1f}" width="24" height="10" fill="{color}" '
                    f'fill-opacity="0.25"/>'
                )
            else:
                self.out.append(self._seg(lx + 6, y - 4, lx + 30, y - 4, Line([], [], color, style=style, width=1.5)))
            for line in text.splitlines():
                self.out.append(f'<text x="{lx + 36:.1f}" y="{y:.1f}" font-size="11">{escape(line)}</text>')
                y += 15
