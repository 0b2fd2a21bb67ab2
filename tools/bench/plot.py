"""``report.png``: each pipeline's images/s (log scale), labelled with its share of its limit;
drawn from the report's rows alone (``tools.bench.render``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.bench.schema import PIPELINES, Row

if TYPE_CHECKING:
    from tools.bench.render_cores import CoresAnswer


def colours(rows: list[Row]) -> dict[str, str]:
    """A colour per family of pipelines (a peer's variants share one: "ffcv (raw)" and
    "ffcv (jpg)"), the project's loaders first, in matplotlib's default cycle."""
    families: list[str] = []
    for row in sorted(rows, key=lambda r: r.kind != "loader"):
        family = row.name.split(" (")[0]
        if family not in families:
            families.append(family)
    return {row.name: f"C{families.index(row.name.split(' (')[0]) % 10}" for row in rows}


def plot_report(path: Path, rows: list[Row], cores: CoresAnswer | None = None) -> None:
    """Each pipeline's images/s; under them, where ``cores`` has rows, the cores each needs to
    keep a node's GPUs fed against the node's cores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = colours(rows)
    with_cores = cores is not None and bool(cores.rows)
    fig, axes = plt.subplots(
        2 if with_cores else 1, 2, figsize=(13, 11 if with_cores else 5.5), squeeze=False
    )
    for ax, task in zip(axes[0], PIPELINES, strict=True):
        rates_panel(ax, task, rows, colour)
    if cores is not None and with_cores:
        for ax, task in zip(axes[1], PIPELINES, strict=True):  # under its rates panel
            cores_panel(ax, task, cores, colour)
    fig.tight_layout()
    # No timestamp in the file: the same report.json draws the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def rates_panel(ax: Any, task: str, rows: list[Row], colour: dict[str, str]) -> None:
    """``task``'s rows: images/s (log), each labelled with its share of its limit."""
    task_rows = [r for r in rows if r.pipeline == task and r.images_per_s]
    labels = [f"{r.name}\n{r.workers}w" for r in task_rows]
    values = [r.images_per_s for r in task_rows]
    bars = ax.bar(range(len(values)), values, color=[colour[r.name] for r in task_rows])
    for bar, row in zip(bars, task_rows, strict=True):
        if row.share:
            ax.annotate(
                f"{100 * row.share:.0f}%",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("images / s (log)")
    ax.set_title(f"{task} pipeline (labels: share of the limit)")
    ax.grid(axis="y", alpha=0.3)


def cores_panel(ax: Any, task: str, cores: CoresAnswer, colour: dict[str, str]) -> None:
    """``task``'s pipelines: the cores a node's GPUs need (log), the node's cores as a line,
    each bar labelled with the cores to spare or the share of the GPU rate fed."""
    task_rows = [r for r in cores.rows if r.pipeline == task]
    if not task_rows:
        ax.set_axis_off()
        return
    gpus, node = task_rows[0].node_gpus, task_rows[0].node_cores
    values = [r.cores_needed for r in task_rows]
    bars = ax.barh(range(len(values)), values, color=[colour.get(r.name, "C0") for r in task_rows])
    for bar, row in zip(bars, task_rows, strict=True):
        label = f" {row.spare:,.0f} spare" if row.fed else f" {100 * row.share_fed:.0f}% fed"
        ax.annotate(
            label, (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center", fontsize=8
        )
    ax.axvline(node, color="k", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(values)), [f"{r.name} ({r.workers}w)" for r in task_rows], fontsize=8)
    ax.invert_yaxis()  # the fewest cores on top, as in the table
    ax.set_xscale("log")
    ax.set_xlim(right=max(node, *values) * 4)  # room for the labels
    ax.set_xlabel(f"cores for {gpus} GPUs (log; dashed: the node's {node})")
    ax.set_title(
        f"{task}: cores to feed {gpus} GPUs at {cores.rate.images_per_s:,.0f} images/s each"
    )
    ax.grid(axis="x", alpha=0.3)
