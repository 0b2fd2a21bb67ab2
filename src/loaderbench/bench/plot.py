"""``report.png``: each pipeline's images/s (log scale), labelled with its share of its limit;
drawn from the report's rows alone (``loaderbench.bench.render``)."""

from __future__ import annotations

from pathlib import Path

from loaderbench.bench.schema import PIPELINES, Row


def colours(rows: list[Row]) -> dict[str, str]:
    """A colour per family of pipelines (a peer's variants share one: "ffcv (raw)" and
    "ffcv (jpg)"), the project's loaders first, in matplotlib's default cycle."""
    families: list[str] = []
    for row in sorted(rows, key=lambda r: r.kind != "loader"):
        family = row.name.split(" (")[0]
        if family not in families:
            families.append(family)
    return {row.name: f"C{families.index(row.name.split(' (')[0]) % 10}" for row in rows}


def plot_report(path: Path, rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = colours(rows)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for ax, task in zip(axes, PIPELINES, strict=True):
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
    fig.tight_layout()
    # No timestamp in the file: the same report.json draws the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
