"""Aggregate replay results into ``results.json``, a markdown summary and a plot.

``results.json`` holds every run (workload, policy, batching window, seed, unallocated GPU % at
100 % arrived, allocation % at 130 %, pods, placed pods, seconds), the mean and standard deviation
over seeds per workload and policy (population standard deviation, as the paper's summary), the
paper's published figures where they exist, and the mean allocation-vs-arrived curve per workload
and policy.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.openb.paper import PaperCurves
from bench.openb.protocol import MAX_PERCENT
from bench.openb.replay import RunResult
from bench.openb.trace import TRACE_SOURCE

PAPER_CITATION = (
    'Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with '
    'Fragmentation Gradient Descent", USENIX ATC 2023'
)
DISPLAY = {
    "random": "Random",
    "dotprod": "DotProd",
    "clustering": "Clustering",
    "packing": "Packing",
    "bestfit": "BestFit",
    "fgd": "FGD",
    "fgd-2d": "FGD-2D",
    "tessera": "Tessera",
    "tessera-no-loss": "Tessera w/o packing loss",
    "tessera-no-strand": "Tessera w/o stranding",
    "tessera-no-reserve": "Tessera w/o reservation",
}
PLOT_FROM = 80
COLORS = {
    "random": "tab:blue",
    "dotprod": "tab:orange",
    "clustering": "tab:green",
    "packing": "tab:red",
    "bestfit": "tab:purple",
    "fgd": "tab:brown",
    "fgd-2d": "tab:olive",
    "tessera": "black",
    "tessera-no-loss": "tab:cyan",
    "tessera-no-strand": "tab:pink",
    "tessera-no-reserve": "tab:gray",
}


def display(label: str) -> str:
    name, _, window = label.partition("@")
    base = DISPLAY.get(name, name)
    return f"{base} (batch {window})" if window else base


@dataclass(frozen=True)
class Cell:
    """Mean and population std over seeds of one workload x policy."""

    unallocated: tuple[float, float]
    alloc_130: tuple[float, float]
    curve: list[float]
    seeds: int


def _label(res: RunResult) -> str:
    return res.spec.policy + (f"@{res.spec.batch}" if res.spec.batch > 1 else "")


def aggregate(results: Sequence[RunResult]) -> dict[str, dict[str, Cell]]:
    """Per workload, per policy label: the statistics over seeds."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.spec.workload, _label(r)), []).append(r)
    out: dict[str, dict[str, Cell]] = {}
    for (workload, label), runs in groups.items():
        un = np.array([r.unallocated_100 for r in runs])
        al = np.array([r.alloc_130 for r in runs])
        curves = np.array([r.curve for r in runs], dtype=np.float64)
        with warnings.catch_warnings():  # percents no run reached stay NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_curve = np.nanmean(curves, axis=0)
        out.setdefault(workload, {})[label] = Cell(
            unallocated=(float(un.mean()), float(un.std())),
            alloc_130=(float(al.mean()), float(al.std())),
            curve=[round(float(x), 3) for x in mean_curve],
            seeds=len(runs),
        )
    return out


def _paper_stat(
    paper: PaperCurves | None, workload: str, label: str, which: str
) -> tuple[float, float] | None:
    if paper is None or "@" in label:
        return None
    if which == "unallocated":
        return paper.unallocated(workload, label)
    return paper.alloc_130(workload, label)


def results_json(
    results: Sequence[RunResult],
    paper: PaperCurves | None,
    *,
    command: str,
    wall_seconds: float,
) -> dict[str, object]:
    table = aggregate(results)
    summary: dict[str, dict[str, object]] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    for workload, cells in table.items():
        summary[workload] = {}
        curves[workload] = {}
        for label, cell in cells.items():
            summary[workload][label] = {
                "unallocated_100": [round(x, 3) for x in cell.unallocated],
                "alloc_130": [round(x, 3) for x in cell.alloc_130],
                "seeds": cell.seeds,
                "paper_unallocated_100": _rounded(
                    _paper_stat(paper, workload, label, "unallocated")
                ),
                "paper_alloc_130": _rounded(_paper_stat(paper, workload, label, "alloc")),
            }
            curves[workload][label] = cell.curve
    return {
        "benchmark": "openb trace replay",
        "paper": PAPER_CITATION,
        "trace": "Alibaba cluster-trace-gpu-v2023 (openb), from " + TRACE_SOURCE,
        "metric": {
            "unallocated_100": "100 - allocation % when the arrived request is 100 % of capacity",
            "alloc_130": "allocation % when the arrived GPU request is 130 % of capacity",
            "std": "population standard deviation over seeds",
        },
        "command": command,
        "wall_seconds": round(wall_seconds, 1),
        "cpu_seconds": round(sum(r.cpu_seconds for r in results), 1),
        "runs": [
            {
                "workload": r.spec.workload,
                "policy": r.spec.policy,
                "batch": r.spec.batch,
                "seed": r.spec.seed,
                "unallocated_100": r.unallocated_100,
                "alloc_130": r.alloc_130,
                "pods": r.pods,
                "placed": r.placed,
                "seconds": round(r.seconds, 2),
                "cpu_seconds": round(r.cpu_seconds, 2),
            }
            for r in results
        ],
        "summary": summary,
        "curves": curves,
    }


def _rounded(x: tuple[float, float] | None) -> list[float] | None:
    return None if x is None else [round(x[0], 3), round(x[1], 3)]


def _policy_order(labels: set[str]) -> list[str]:
    order = list(DISPLAY)

    def key(label: str) -> tuple[int, int]:
        name, _, window = label.partition("@")
        return (order.index(name) if name in order else len(order), int(window or 1))

    return sorted(labels, key=key)


def markdown(
    results: Sequence[RunResult],
    paper: PaperCurves | None,
    *,
    command: str,
    wall_seconds: float,
) -> str:
    """Two tables (unallocated at 100 %, allocation at 130 %), paper means in brackets."""
    table = aggregate(results)
    workloads = list(dict.fromkeys(r.spec.workload for r in results))
    labels = _policy_order({lab for cells in table.values() for lab in cells})
    seeds = sorted({r.spec.seed for r in results})
    cpu = sum(r.cpu_seconds for r in results)
    lines = [
        "# openb replay results",
        "",
        f"Command: `{command}`  ",
        f"Seeds: {seeds[0]}..{seeds[-1]} ({len(seeds)}); {len(results)} runs; wall time "
        f"{wall_seconds / 60:.1f} min, CPU time {cpu / 60:.1f} min.  ",
        f"Trace: Alibaba cluster-trace-gpu-v2023 (openb). Paper: {PAPER_CITATION}.",
        "",
    ]
    for which, title, better in (
        ("unallocated", "Unallocated GPU % at 100 % arrived", "lower is better"),
        ("alloc", "GPU allocation % at 130 % arrived", "higher is better"),
    ):
        lines += [
            f"## {title} ({better})",
            "",
            "Mean ± std over seeds; the paper's published mean in brackets.",
            "",
            "| workload | " + " | ".join(display(lab) for lab in labels) + " |",
            "|---|" + "---|" * len(labels),
        ]
        for w in workloads:
            cells = []
            for lab in labels:
                cell = table.get(w, {}).get(lab)
                if cell is None:
                    cells.append("")
                    continue
                m, s = cell.unallocated if which == "unallocated" else cell.alloc_130
                text = f"{m:.2f} ± {s:.2f}"
                pub = _paper_stat(paper, w, lab, which)
                if pub is not None:
                    text += f" [{pub[0]:.2f}]"
                cells.append(text)
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(results: Sequence[RunResult], paper: PaperCurves | None, path: Path) -> None:
    """Allocation % vs arrived %, one panel per workload, ours solid and the paper's dashed."""
    table = aggregate(results)
    curves = {w: {lab: cell.curve for lab, cell in cells.items()} for w, cells in table.items()}
    plot_curves(curves, paper, path)


def plot_curves(
    curves: dict[str, dict[str, list[float]]], paper: PaperCurves | None, path: Path
) -> None:
    """Plot mean curves (``curves[workload][policy label]``, as in ``results.json``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(curves)
    labels = _policy_order({lab for cells in curves.values() for lab in cells})
    cols = min(4, len(workloads))
    rows = (len(workloads) + cols - 1) // cols
    width = max(4.2 * cols, 8.0)
    fig, axes = plt.subplots(rows, cols, figsize=(width, 3.4 * rows + 0.9), squeeze=False)
    colors = {lab: COLORS.get(lab.partition("@")[0], "tab:gray") for lab in labels}
    styles = {lab: ":" if "@" in lab else "-" for lab in labels}
    widths = {lab: 2.0 if lab.startswith("tessera") else 1.4 for lab in labels}
    x = np.arange(PLOT_FROM, MAX_PERCENT + 1)
    with_paper = False
    for ax, w in zip(axes.flat, workloads, strict=False):
        for lab in labels:
            ours = curves[w].get(lab)
            if ours is not None:
                y = np.array([np.nan if v is None else v for v in ours], dtype=np.float64)
                ax.plot(x, y[PLOT_FROM:], color=colors[lab], lw=widths[lab], ls=styles[lab])
            name = lab.partition("@")[0]
            pub = None if (paper is None or "@" in lab) else paper.mean_curve(w, name)
            if pub is not None:
                ax.plot(x, pub[PLOT_FROM:], color=colors[lab], lw=1.0, ls="--", alpha=0.8)
                with_paper = True
        ax.set_title(w, fontsize=10)
        ax.set_xlim(PLOT_FROM, MAX_PERCENT)
        ax.grid(alpha=0.3)
        ax.set_xlabel("arrived GPU request, % of capacity", fontsize=8)
        ax.set_ylabel("GPU allocation, %", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.axis("off")
    handles = [
        plt.Line2D([], [], color=colors[lab], lw=widths[lab], ls=styles[lab]) for lab in labels
    ]
    names = [display(lab) for lab in labels]
    if with_paper:
        handles.append(plt.Line2D([], [], color="grey", lw=1.0, ls="--"))
        names.append("paper (published runs)")
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 5), fontsize=9)
    title = "openb replay: GPU allocation vs arrived workload"
    fig.suptitle(title + (" (solid: ours, dashed: paper)" if with_paper else ""))
    fig.tight_layout(rect=(0, 0.9 / (3.4 * rows + 0.9), 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _clean(value: object) -> object:
    """NaN -> None (valid JSON), recursively."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def dumps(data: dict[str, object]) -> str:
    """Indented JSON with every list of scalars and every run on one line (small and diffable)."""
    text = json.dumps(_clean(data), indent=1)
    text = re.sub(
        r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text
    )
    return re.sub(
        r"\{\s*(\"workload\"[^{}]*?)\s*\}",
        lambda m: "{" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "}",
        text,
    )


def write_all(
    out_dir: Path,
    results: Sequence[RunResult],
    paper: PaperCurves | None,
    *,
    command: str,
    wall_seconds: float,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = results_json(results, paper, command=command, wall_seconds=wall_seconds)
    (out_dir / "results.json").write_text(dumps(data) + "\n")
    (out_dir / "summary.md").write_text(
        markdown(results, paper, command=command, wall_seconds=wall_seconds) + "\n"
    )
    plot(results, paper, out_dir / "allocation.png")
