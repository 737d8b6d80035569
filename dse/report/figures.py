"""The report's figures, drawn with matplotlib (Agg) from plain arrays and labels.

Each function takes what it draws (values already in display units, axis labels already
written) and returns a :class:`matplotlib.figure.Figure`; :func:`save` writes it as PNG and SVG.
Nothing here reads a dataset: :mod:`dse.report` decides what to show and how to label it.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402  (a matplotlib dependency)

from dse import atomic  # noqa: E402

DPI = 110
MAX_BACKGROUND = 20000  # dominated points drawn per panel (a fixed random sample beyond that)
MAX_LABELS = 28  # front points tagged per panel (the key beside the plot lists them)
RC = {
    "svg.fonttype": "none",  # text stays text: small, searchable SVG
    "svg.hashsalt": "hetersim-report",  # stable element ids, so reruns give identical files
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
PALETTE = plt.get_cmap("tab10").colors


def style():
    """The context every figure is drawn and saved in."""
    return plt.rc_context(RC)


def save(fig: Figure, out_dir: Path, name: str) -> dict[str, Path]:
    """Write ``name.png`` and ``name.svg`` (no timestamps: identical reruns give identical files),
    each atomically (:mod:`dse.atomic`): a failed write leaves no partial or empty file."""
    paths = {"png": out_dir / f"{name}.png", "svg": out_dir / f"{name}.svg"}
    try:
        with style():
            png, svg = io.BytesIO(), io.BytesIO()
            fig.savefig(png, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
            fig.savefig(svg, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    finally:
        plt.close(fig)
    # A 256-colour palette keeps a plot's look at a third of the size (reports live in git).
    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    atomic.atomic_write(paths["png"], lambda tmp: small.save(tmp, format="PNG", optimize=True))
    atomic.write_bytes(paths["svg"], svg.getvalue())
    return paths


@mticker.FuncFormatter
def LOG_TICKS(value: float, _pos) -> str:
    """Plain numbers on log axes, at 1, 2 and 5 times a power of ten."""
    if value <= 0:
        return ""
    lead = value / 10 ** np.floor(np.log10(value))
    return f"{value:g}" if any(abs(lead - d) < 1e-6 for d in (1, 2, 5)) else ""


def wrap(label: str, width: int = 48) -> str:
    return textwrap.fill(label, width)


# --------------------------------------------------------------------------------------------
# Pareto fronts
# --------------------------------------------------------------------------------------------


@dataclass
class FrontPanel:
    """One panel of a front figure: every point (``x``, ``y``, colour code ``c``), which of them
    form the front (indices, sorted by x), a short tag per front point ('' for none: drawn, not
    tagged) and the text each tag stands for (listed in a key beside the plot)."""

    title: str
    x: np.ndarray
    y: np.ndarray
    c: np.ndarray
    front: np.ndarray
    tags: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)


def _zoom(values: np.ndarray, front: np.ndarray, stretch: float) -> tuple[tuple[float, float], bool]:
    """(axis limits, log scale?) that frame the front and dominated points up to ``stretch``
    times its far end; log when the front itself spans a factor of 8 or more."""
    lo, hi = float(front.min()), float(front.max())
    top = min(float(np.nanmax(values)), max(hi, lo) * stretch)
    if lo > 0 and hi / lo >= 8:
        pad = (top / lo) ** 0.04
        return (lo / pad, top * pad), True
    pad = 0.06 * (top - lo) if top > lo else 0.05 * abs(lo) + 1e-9
    return (lo - pad, top + pad), False


def front_figure(panels: Sequence[FrontPanel], xlabel: str, ylabel: str, color_names: Sequence[str]) -> Figure:
    """Per panel: dominated points faint behind, the front as a staircase, its points tagged and
    the tags explained in a key on the right. Axes frame the front (``stretch`` 3x beyond it)."""
    with style():
        n = len(panels)
        fig, axes = plt.subplots(
            n,
            2,
            figsize=(11.5, 4.8 * n),
            squeeze=False,
            gridspec_kw={"width_ratios": (3.0, 2.0), "wspace": 0.05, "hspace": 0.35},
        )
        rng = np.random.default_rng(0)
        for (ax, key_ax), p in zip(axes, panels, strict=True):
            fx, fy = p.x[p.front], p.y[p.front]
            (xlim, xlog), (ylim, ylog) = _zoom(p.x, fx, 3.0), _zoom(p.y, fy, 3.0)
            rest = np.setdiff1d(np.arange(len(p.x)), p.front)
            inside = rest[(p.x[rest] <= xlim[1]) & (p.y[rest] <= ylim[1])]
            outside = len(rest) - len(inside)
            if inside.size > MAX_BACKGROUND:
                inside = np.sort(rng.choice(inside, MAX_BACKGROUND, replace=False))
            for code in np.unique(p.c):
                sel = inside[p.c[inside] == code]
                ax.scatter(p.x[sel], p.y[sel], s=7, color=PALETTE[code % 10], alpha=0.18, linewidths=0, rasterized=True)
            ax.step(fx, fy, where="post", color="0.25", lw=1.0, zorder=2)
            for code in np.unique(p.c):
                sel = p.c[p.front] == code
                ax.scatter(
                    fx[sel], fy[sel], s=30, color=PALETTE[code % 10], edgecolors="black", linewidths=0.7, zorder=3
                )
            for i, tag in enumerate(p.tags):
                if tag:
                    ax.annotate(
                        tag,
                        (fx[i], fy[i]),
                        xytext=(4, 5 if i % 2 == 0 else -11),
                        textcoords="offset points",
                        fontsize=7.5,
                        fontweight="bold",
                        color="0.1",
                        zorder=4,
                    )
            for set_scale, axis, log in ((ax.set_xscale, ax.xaxis, xlog), (ax.set_yscale, ax.yaxis, ylog)):
                if log:
                    set_scale("log")
                    axis.set_major_formatter(LOG_TICKS)
                    axis.set_minor_formatter(LOG_TICKS)
            ax.set_xlim(*xlim)
            ax.set_ylim(*ylim)
            ax.set_xlabel(wrap(xlabel))
            ax.set_ylabel(wrap(ylabel))
            ax.set_title(p.title)
            ax.grid(True, lw=0.4, alpha=0.5)
            handles = [
                plt.Line2D([], [], marker="o", ls="", color=PALETTE[k % 10], label=color_names[k])
                for k in np.unique(p.c)
            ]
            handles.append(
                plt.Line2D([], [], marker="o", color="0.25", mfc="white", mec="black", lw=1.0, label="Pareto front")
            )
            title = "faint: dominated"
            if outside:
                title += f"\n({outside:,} beyond the axes)"
            ax.legend(handles=handles, fontsize=7, loc="upper right", title=title, title_fontsize=7)
            key_ax.axis("off")
            lines = [f"{t:>4}  {k}" for t, k in zip(p.tags, p.keys, strict=True) if t]
            if lines:
                key_ax.text(
                    0.0, 1.0, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=7,
                    transform=key_ax.transAxes,
                )  # fmt: skip
        return fig


def pick_labels(n: int, limit: int = MAX_LABELS) -> np.ndarray:
    """Which of ``n`` front points (sorted along the front) get a label: all, or ``limit`` spread
    evenly including both ends."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, limit)).astype(int))


# --------------------------------------------------------------------------------------------
# Bars
# --------------------------------------------------------------------------------------------


def stacked_bars(
    rows: Sequence[str],
    parts: Sequence[tuple[str, np.ndarray]],
    xlabel: str,
    title: str,
    markers: Sequence[tuple[str, np.ndarray]] = (),
    shares: bool = False,
) -> Figure:
    """Horizontal stacked bars, one per row (top to bottom in the given order), with optional
    per-row markers (e.g. a capacity) drawn as vertical ticks. ``shares`` adds a second panel
    with each part as a percentage of its row's total."""
    with style():
        n = len(rows)
        ncols = 2 if shares else 1
        fig, axes = plt.subplots(
            1, ncols, figsize=(12.0 if shares else 10.0, 1.6 + 0.32 * n), squeeze=False, sharey=True
        )
        y = np.arange(n)[::-1]
        values = [np.nan_to_num(np.asarray(v, dtype=float), nan=0.0) for _, v in parts]
        total = np.sum(values, axis=0)
        for col, ax in enumerate(axes[0]):
            left = np.zeros(n)
            for k, ((label, _), v) in enumerate(zip(parts, values, strict=True)):
                w = v if col == 0 else 100.0 * np.divide(v, total, out=np.zeros(n), where=total > 0)
                ax.barh(y, w, left=left, height=0.7, color=PALETTE[k % 10], label=label if col == 0 else None)
                left += w
            ax.grid(True, axis="x", lw=0.4, alpha=0.5)
            ax.set_xlabel(wrap(xlabel) if col == 0 else "share of the total [%]")
        ax = axes[0][0]
        for k, (label, v) in enumerate(markers):
            ax.scatter(v, y, marker="|", s=260, color=["black", "firebrick"][k % 2], zorder=3, label=label)
        ax.set_yticks(y, rows, fontsize=7)
        if shares:
            axes[0][1].set_xlim(0, 100)
            for yi, t in zip(y, total, strict=True):
                ax.annotate(f"{t:.3g}", (t, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=6.5)
        fig.suptitle(title, fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        axes[0][-1].legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        fig.tight_layout()
        return fig


def tier_bars(rows: Sequence[str], panels: Sequence[tuple[str, np.ndarray, np.ndarray | None]], title: str) -> Figure:
    """One panel per memory tier (``(axis label, used, capacity or None)``), side by side with the
    rows shared: per row a bar of what is used and, below it, a grey bar of the capacity."""
    with style():
        n, k = len(rows), len(panels)
        fig, axes = plt.subplots(1, k, figsize=(2.2 + 2.9 * k, 1.5 + 0.3 * n), squeeze=False, sharey=True)
        y = np.arange(n)[::-1]
        for j, (ax, (label, used, capacity)) in enumerate(zip(axes[0], panels, strict=True)):
            used = np.nan_to_num(np.asarray(used, dtype=float), nan=0.0)
            ax.barh(y + 0.19, used, height=0.38, color=PALETTE[j % 10], label="used")
            if capacity is not None:
                cap = np.nan_to_num(np.asarray(capacity, dtype=float), nan=0.0)
                ax.barh(y - 0.19, cap, height=0.38, color="0.78", label="capacity")
                for yi, u, c in zip(y, used, cap, strict=True):
                    if c > 0:
                        ax.annotate(
                            f"{100 * u / c:.0f}%", (max(u, c), yi), xytext=(2, 0), textcoords="offset points",
                            va="center", fontsize=6,
                        )  # fmt: skip
            ax.set_xlabel(wrap(label, 30))
            ax.grid(True, axis="x", lw=0.4, alpha=0.5)
            ax.margins(x=0.12)
            ax.legend(fontsize=6.5, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
        axes[0][0].set_yticks(y, rows, fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        return fig


def signed_bars(labels: Sequence[str], values: np.ndarray, xlabel: str, title: str) -> Figure:
    """Horizontal bars around zero (elasticities: positive = the metric grows with the input)."""
    with style():
        n = len(labels)
        fig, ax = plt.subplots(figsize=(8.5, 1.4 + 0.28 * n))
        y = np.arange(n)[::-1]
        values = np.asarray(values, dtype=float)
        ax.barh(y, values, color=[PALETTE[3] if v > 0 else PALETTE[0] for v in values], height=0.7)
        ax.axvline(0.0, color="0.3", lw=0.8)
        ax.set_yticks(y, labels, fontsize=7)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(True, axis="x", lw=0.4, alpha=0.5)
        fig.tight_layout()
        return fig


# --------------------------------------------------------------------------------------------
# Heat maps
# --------------------------------------------------------------------------------------------


@dataclass
class HeatPanel:
    title: str
    grid: np.ndarray  # (len(rows), len(cols)); NaN where no feasible configuration
    rows: list[str]
    cols: list[str]
    sampled: np.ndarray | None = None  # False where no configuration was evaluated (a search's gaps)


def cell_text(v: float) -> str:
    """3 significant digits, without exponents for large values."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _norm(grid: np.ndarray):
    finite = grid[np.isfinite(grid)]
    if finite.size and finite.min() > 0 and finite.max() / finite.min() > 10:
        return LogNorm(finite.min(), finite.max())
    if finite.size and finite.max() > finite.min():
        return Normalize(finite.min(), finite.max())
    centre = float(finite[0]) if finite.size else 0.0
    return Normalize(centre - 1.0, centre + 1.0)


def heatmap_figure(panels: Sequence[HeatPanel], xlabel: str, ylabel: str, cbar_label: str, sense: str) -> Figure:
    """Best value per cell, annotated; empty cells grey with a dash, or "not sampled" where the
    panel's ``sampled`` says no configuration was evaluated. Better values are lighter.
    Each panel has its own colour scale (panels are different models)."""
    with style():
        n = len(panels)
        ncols = min(n, 2)
        nrows = -(-n // ncols)
        w = max(4.6, 0.75 * max(len(p.cols) for p in panels) + 2.8)
        h = max(3.2, 0.42 * max(len(p.rows) for p in panels) + 1.6)
        fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
        cmap = plt.get_cmap("viridis_r" if sense == "min" else "viridis").with_extremes(bad="0.92")
        for ax, p in zip(axes.ravel(), panels, strict=False):
            norm = _norm(p.grid)
            image = ax.imshow(np.ma.masked_invalid(p.grid), cmap=cmap, norm=norm, aspect="auto", origin="lower")
            ax.set_xticks(range(len(p.cols)), p.cols, rotation=30 if max(map(len, p.cols)) > 5 else 0, ha="right")
            ax.set_yticks(range(len(p.rows)), p.rows)
            ax.set_xlabel(wrap(xlabel, 40))
            ax.set_ylabel(wrap(ylabel, 40))
            ax.set_title(p.title)
            ax.spines[:].set_visible(False)
            for (i, j), v in np.ndenumerate(p.grid):
                if np.isfinite(v):
                    shade = float(norm(v))
                    dark = shade > 0.55 if sense == "min" else shade < 0.45
                    ax.text(
                        j, i, cell_text(v), ha="center", va="center", fontsize=7, color="white" if dark else "black"
                    )
                elif p.sampled is not None and not p.sampled[i, j]:
                    ax.text(j, i, "not\nsampled", ha="center", va="center", fontsize=6, color="0.45")
                else:
                    ax.text(j, i, "–", ha="center", va="center", fontsize=8, color="0.5")
            fig.colorbar(image, ax=ax, label=wrap(cbar_label, 34), shrink=0.9)
        for ax in axes.ravel()[n:]:
            ax.set_visible(False)
        fig.tight_layout()
        return fig
