"""The ladder of worker counts, when to climb it, and the choice: decisions on a probe's rows
(``rung.ProbeRow``), nothing measured here, so each is tested on rows given by hand."""

from __future__ import annotations

from collections.abc import Callable

from loaderbench.autotune._rung import ProbeRow, pooled
from loaderbench.config.loader import AutotuneSettings

# A count's row measured, and whether the probe still has time after it.
Measure = Callable[[int], tuple[ProbeRow, bool]]


def worker_ladder(max_workers: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... below ``max_workers``, then ``max_workers``
    itself (at least 1): steps of about 1.5x, so a 64-core node needs 12 rungs, not 64."""
    top = max(1, max_workers)
    ladder, step = [1, 2, 3], 4
    while step < top:
        ladder += [step, step + step // 2]
        step *= 2
    return [n for n in ladder if n < top] + [top]


def near_best(rows: list[ProbeRow], fraction: float) -> list[int]:
    """The counts whose images/s is at least ``(1 - fraction)`` x the best seen."""
    best = max(row.images_per_s for row in rows)
    return [row.workers for row in rows if row.images_per_s >= (1 - fraction) * best]


def fed_wait(tolerance: float) -> float:
    """The data wait at or below which a loop is fed: removing a wait ``w`` speeds it up at
    most ``1 / (1 - w)`` times, within ``1 + tolerance`` for ``w <= tolerance / (1 +
    tolerance)`` (4.8% at the default 5%)."""
    return tolerance / (1 + tolerance)


def fed(rows: list[ProbeRow], tolerance: float) -> list[int]:
    """The counts whose loop was fed (``fed_wait``): none without a model, whose loop waits
    for nothing else."""
    return [row.workers for row in rows if row.data_wait_frac <= fed_wait(tolerance)]


def choose(rows: list[ProbeRow], tolerance: float) -> int:
    """The fewest workers whose images/s is at least ``(1 - tolerance)`` x the best seen, or
    whose loop was fed (no more workers could make it faster by more than the tolerance)."""
    if not rows:
        raise ValueError("no worker count was measured")
    return min(near_best(rows, tolerance) + fed(rows, tolerance))


def to_confirm(rows: list[ProbeRow], within: float, tolerance: float) -> list[int]:
    """The counts to measure a second time: every one within ``within`` of the best rate,
    when there are two or more (``within`` is about twice the tolerance: the counts a window's
    noise could move across the tolerance's edge). None when one count stands clear, or when
    the fewest of them was fed (then the rates do not decide)."""
    if within <= 0 or len(rows) < 2:
        return []
    close = near_best(rows, within)
    if len(close) < 2 or min(close) in fed(rows, tolerance):
        return []
    return close


# A GIL held this share of the time leaves more threads in the process little to gain (at
# most 1 / share x) and costs every thread more hand-offs (docs/gil.md).
GIL_BOUND = 0.7


def gil_bound(row: ProbeRow) -> bool:
    """Whether the count's process held its GIL so much that more threads cannot help."""
    return row.gil_frac is not None and row.gil_frac >= GIL_BOUND


def keep_climbing(rows: list[ProbeRow], gain: float, tolerance: float) -> bool:
    """Try the next count: not once the loop is fed (more workers could only take CPU from
    it), nor once a count holds the GIL ``GIL_BOUND`` of the time (threads past it queue for
    the GIL); else always after the first, then while the last one beat the best before it by
    more than ``gain``."""
    if rows[-1].data_wait_frac <= fed_wait(tolerance) or gil_bound(rows[-1]):
        return False
    if len(rows) == 1:
        return True
    before = max(row.images_per_s for row in rows[:-1])
    return rows[-1].images_per_s > (1 + gain) * before


def climb(
    ladder: list[int],
    measure: Measure,
    options: AutotuneSettings,
    on_row: Callable[[ProbeRow], None] = lambda row: None,
) -> list[ProbeRow]:
    """The rows of a probe: ``ladder``'s counts measured in order while ``keep_climbing``
    says so and the probe has time; then, where two or more came out close to the best
    (``to_confirm``), those measured again, in reverse order (a drift of the machine over the
    probe weighs on both ends alike), each row pooling both windows. ``on_row`` sees each
    row as it is measured or pooled."""
    rows: list[ProbeRow] = []
    in_time = True
    for workers in ladder:
        row, in_time = measure(workers)
        rows.append(row)
        on_row(row)
        if not in_time or not keep_climbing(rows, options.gain, options.tolerance):
            break
    confirm = to_confirm(rows, options.confirm_within, options.tolerance)
    for workers in reversed(confirm if in_time else []):
        again, in_time = measure(workers)
        at = next(i for i, row in enumerate(rows) if row.workers == workers)
        rows[at] = pooled(rows[at], again)
        on_row(rows[at])
        if not in_time:
            break
    return rows
