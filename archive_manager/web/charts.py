"""Line charts as geometry for inline SVG: pure functions, no markup.

The templates draw the SVG from these numbers, so every label goes through Jinja's
autoescaping like any other text, and the pages need no script and no network.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..lens.stats import RolloutStats

__all__ = [
    "Band",
    "Chart",
    "Dot",
    "Line",
    "Series",
    "Tick",
    "drift_charts",
    "line_chart",
    "logprob_chart",
    "mask_runs",
    "nice_ticks",
]

#: At most this many points per drawn line: a long response is reduced to per-bucket values.
MAX_POINTS = 600
#: Lines with at most this many points also get a dot (with a tooltip) per point.
MAX_DOTS = 120
_LARGEST = sys.float_info.max


@dataclass(frozen=True)
class Series:
    """One line to draw: values against x (a None value breaks the line)."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    style: int = 0
    dashed: bool = False


@dataclass(frozen=True)
class Tick:
    """An axis tick: its position in SVG coordinates and its label."""

    position: float
    label: str


@dataclass(frozen=True)
class Dot:
    """A point with a tooltip."""

    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Line:
    """A series in SVG coordinates: polyline point lists and optional dots."""

    label: str
    style: int
    dashed: bool
    segments: list[str]
    dots: list[Dot]


@dataclass(frozen=True)
class Band:
    """A shaded range of x (e.g. tokens without loss), in SVG coordinates."""

    x: float
    width: float


@dataclass(frozen=True)
class Chart:
    """Everything a template needs to draw one chart."""

    title: str
    width: int
    height: int
    left: float
    top: float
    right: float
    bottom: float
    x_label: str
    y_label: str
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    legend: list[tuple[str, int, bool]] = field(default_factory=list)
    empty: str | None = None


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values within ``[low, high]`` (steps of 1, 2, 2.5, 5 x 10^k)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        return [low]
    span = high - low
    if not math.isfinite(span):
        # Both ends are finite but the span is not (e.g. -1.7e308 .. 1.7e308): tick the
        # halved range, whose span is finite, and double the ticks back.
        return [min(max(2 * v, low), high) for v in nice_ticks(low / 2, high / 2, count)]
    magnitude = 10.0 ** math.floor(math.log10(span / max(1, count)))
    if magnitude == 0:  # a span within a few subnormals of zero: no round steps
        return [low, high]
    # The round step whose number of intervals is closest to ``count``.
    step = min(
        (m * magnitude for m in (1, 2, 2.5, 5, 10)),
        key=lambda s: (abs(span / s - count), -s),
    )
    first = math.ceil(low / step - 1e-9) * step
    ticks: list[float] = []
    value = first
    # ``value - high``, not ``high + step * 1e-9``: near the largest float the latter is
    # infinite and the loop would never end.  The count cap is a second guard.
    while value - high <= step * 1e-9 and len(ticks) <= 4 * count:
        ticks.append(0.0 if abs(value) < step * 1e-9 else value)
        value += step
    return ticks


def _label(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.3g}"


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _share(value: float, low: float, high: float) -> float:
    """Where ``value`` lies between ``low`` and ``high`` (0 to 1), for any finite floats:
    computed on halves, so a span wider than the largest float does not overflow."""
    return (value / 2 - low / 2) / (high / 2 - low / 2)


def _widen(low: float, high: float, pad: float) -> tuple[float, float]:
    """``low - pad .. high + pad``, kept within the finite floats."""
    return max(low - pad, -_LARGEST), min(high + pad, _LARGEST)


def _mean(values: Sequence[float]) -> float:
    """The mean of finite ``values`` without overflowing on huge ones."""
    return sum(v / len(values) for v in values)


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str = "",
    y_label: str = "",
    width: int = 640,
    height: int = 220,
    y_range: tuple[float, float] | None = None,
    bands: Sequence[tuple[float, float]] = (),
    empty: str = "nothing to draw",
) -> Chart:
    """Lay out ``series`` on shared axes; ``bands`` are ``(x_start, x_end)`` ranges to shade.

    The y axis spans the data (or ``y_range``), padded so flat lines stay visible.
    """
    left, top, right, bottom = 56.0, 26.0, width - 12.0, height - 34.0
    chart = Chart(title, width, height, left, top, right, bottom, x_label, y_label)
    xs = _finite([x for s in series for x, y in zip(s.xs, s.ys, strict=True) if y is not None])
    ys = _finite([y for s in series for y in s.ys])
    if not xs or not ys:
        return replace(chart, empty=empty)
    x_lo, x_hi = min(xs), max(xs)
    for start, end in bands:
        x_lo, x_hi = min(x_lo, start), max(x_hi, end)
    y_lo, y_hi = y_range if y_range is not None else (min(ys), max(ys))
    if y_hi - y_lo < 1e-12:
        y_lo, y_hi = _widen(y_lo, y_hi, abs(y_hi) * 0.1 if abs(y_hi) > 1e-300 else 1.0)
    if x_hi - x_lo < 1e-12:
        x_lo, x_hi = _widen(x_lo, x_hi, max(1.0, abs(x_hi) * 1e-9))

    def sx(x: float) -> float:
        return round(left + _share(x, x_lo, x_hi) * (right - left), 1)

    def sy(y: float) -> float:
        y = min(max(y, y_lo), y_hi)
        return round(bottom - _share(y, y_lo, y_hi) * (bottom - top), 1)

    lines = []
    for s in series:
        segments: list[str] = []
        current: list[str] = []
        dots: list[Dot] = []
        points = [(x, y) for x, y in zip(s.xs, s.ys, strict=True)]
        few = sum(1 for _, y in points if y is not None) <= MAX_DOTS
        for x, y in points:
            if y is None or not math.isfinite(y):
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            current.append(f"{sx(x)},{sy(y)}")
            if few:
                dots.append(Dot(sx(x), sy(y), f"{s.label}: {_label(x)} → {_label(y)}"))
        if current:
            segments.append(" ".join(current))
        lines.append(Line(s.label, s.style, s.dashed, segments, dots))
    return Chart(
        title,
        width,
        height,
        left,
        top,
        right,
        bottom,
        x_label,
        y_label,
        x_ticks=[Tick(sx(v), _label(v)) for v in nice_ticks(x_lo, x_hi, 6)],
        y_ticks=[Tick(sy(v), _label(v)) for v in nice_ticks(y_lo, y_hi, 4)],
        lines=lines,
        bands=[Band(sx(a), max(0.5, sx(b) - sx(a))) for a, b in bands],
        legend=[(s.label, s.style, s.dashed) for s in series],
    )


def _per_bucket(values: Sequence[float | None], bucket: int) -> list[float | None]:
    """The mean of the finite values of each run of ``bucket`` consecutive ones (None for a
    run without any)."""
    if bucket == 1:
        return list(values)
    out: list[float | None] = []
    for start in range(0, len(values), bucket):
        part = _finite(values[start : start + bucket])
        out.append(_mean(part) if part else None)
    return out


def drift_charts(rows: Sequence[RolloutStats]) -> list[Chart]:
    """The pool's drift charts: reward, response length and truncated share by rollout id.

    Training and evaluation rollouts are separate series; rows without a rollout id have no
    place on the axis and are left out.  Past `MAX_POINTS` rollouts a series, each point is
    the mean of a run of consecutive rollouts' figures, drawn at the run's first rollout id
    (the titles say how many): 10,000 rollouts draw as 600 points, not as 10,000.
    """
    charts: dict[str, list[Series]] = {"reward": [], "length": [], "truncated": []}
    widest = 1
    for evaluation, name, base in ((False, "training", 0), (True, "evaluation", 3)):
        part = [r for r in rows if r.evaluation is evaluation and r.rollout_id is not None]
        if not part:
            continue
        bucket = max(1, math.ceil(len(part) / MAX_POINTS))
        widest = max(widest, bucket)
        x = [float(r.rollout_id) for r in part[::bucket] if r.rollout_id is not None]

        def y(
            figure: str, part: list[RolloutStats] = part, bucket: int = bucket
        ) -> list[float | None]:
            return _per_bucket([getattr(r, figure) for r in part], bucket)

        charts["reward"] += [
            Series(f"{name} mean", x, y("reward_mean"), base),
            Series(f"{name} p50", x, y("reward_p50"), base + 1, dashed=True),
            Series(f"{name} p90", x, y("reward_p90"), base + 2, dashed=True),
        ]
        charts["length"] += [
            Series(f"{name} mean", x, y("length_mean"), base),
            Series(f"{name} p90", x, y("length_p90"), base + 2, dashed=True),
        ]
        charts["truncated"].append(
            Series(f"{name}", x, y("truncated_share"), base),
        )
    per = f" (means of up to {widest} rollouts a point)" if widest > 1 else ""
    return [
        line_chart(
            "Reward by rollout" + per,
            charts["reward"],
            width=460,
            x_label="rollout id",
            y_label="reward",
            empty="no rollout with a rollout id and a numeric reward",
        ),
        line_chart(
            "Response length by rollout" + per,
            charts["length"],
            width=460,
            x_label="rollout id",
            y_label="tokens",
            empty="no rollout with a rollout id and response lengths",
        ),
        line_chart(
            "Truncated share by rollout" + per,
            charts["truncated"],
            width=460,
            x_label="rollout id",
            y_label="share",
            y_range=(0.0, 1.0),
            empty="no rollout with a rollout id",
        ),
    ]


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """Runs of equal loss-mask values: ``(value, start, end)`` with ``end`` exclusive."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((int(mask[start]), start, i))
            start = i
    return runs


def logprob_chart(log_probs: Sequence[float], loss_mask: Sequence[int] | None) -> Chart:
    """Per-token log-probs of a response; tokens without loss are shaded.

    A response longer than `MAX_POINTS` tokens is drawn per bucket of consecutive tokens:
    the bucket's mean and its minimum (the most surprising token), so a single bad token
    still shows.
    """
    n = len(log_probs)
    bucket = max(1, math.ceil(n / MAX_POINTS))
    xs, means, lows = [], [], []
    for start in range(0, n, bucket):
        part = [v for v in log_probs[start : start + bucket] if math.isfinite(v)]
        xs.append(float(start))
        means.append(_mean(part) if part else None)
        lows.append(min(part) if part else None)
    series = [Series("log-prob" if bucket == 1 else f"mean of {bucket} tokens", xs, means, 0)]
    if bucket > 1:
        series.append(Series(f"min of {bucket} tokens", xs, lows, 2, dashed=True))
    bands = []
    if loss_mask is not None and len(loss_mask) == n:
        bands = [(float(a), float(b)) for v, a, b in mask_runs(loss_mask) if v == 0]
    return line_chart(
        "Log-probs of the response tokens" + (" (shaded: no loss)" if bands else ""),
        series,
        x_label="response token",
        y_label="log-prob",
        width=1200,
        height=240,
        bands=bands,
        empty="no log-probs recorded",
    )
