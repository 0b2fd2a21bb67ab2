"""The sweep's answer: its jobs ranked by the rate they measured, and the worker count to use.

Best first is the most images/s: every loader, worker count and batch size of one recipe gives
the same top-1 (the same crops), so accuracy is a column, not a rank. A job without a rate (no
steady window) is listed apart with its reason, a failed one with its error. A sweep over
``loader.num_workers`` names, for each value of the other swept keys, the fewest workers whose
rate is within the spread of the best (their ``images_per_s_spread`` overlap): a count that buys
nothing measurable here is not chosen.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from loaderbench.measure.metrics import IMAGES_PER_S, SPREAD

RESIDENT = "resident"  # loader=resident: the model's ceiling, not a loader to choose
WORKERS_KEY = "loader.num_workers"
LOADER_KEYS = ("loader", "loader.name")


def rate(row: dict) -> float | None:
    value = row.get(IMAGES_PER_S)
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class WorkersChoice:
    """The worker count to use for one value of the sweep's other keys (``group``)."""

    group: str  # e.g. "loader=spdl", or "" where only the workers were swept
    rows: list[dict]  # the group's rated rows, by worker count
    chosen: dict
    best: dict

    def within(self, row: dict) -> bool:
        return within_spread(row, self.best)


@dataclass
class Ranking:
    """The sweep's rows, told apart: ``ranked`` (a rate, best first), ``unrated`` (no steady
    window, with its reason), ``failed`` (with its error) and ``stopped`` (interrupted or
    preempted before it ended: not a failure, and not measured whole)."""

    keys: list[str]
    ranked: list[dict] = field(default_factory=list)
    unrated: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    stopped: list[dict] = field(default_factory=list)  # interrupted or preempted: unfinished
    workers: list[WorkersChoice] = field(default_factory=list)

    @property
    def rows(self) -> list[dict]:
        """Every row: the ranked, then those without a rate, the failed, the unfinished."""
        return [*self.ranked, *self.unrated, *self.failed, *self.stopped]

    def loader_leads(self) -> list[tuple[dict, dict, float]]:
        """Each loader's best job against the next loader's best: (row, next row, ratio)."""
        best: dict[str, dict] = {}
        for row in self.ranked:
            if row.get("loader") != RESIDENT:  # the ceiling, not a loader to choose
                best.setdefault(str(row.get("loader")), row)
        firsts = list(best.values())
        return [(a, b, rate(a) / rate(b)) for a, b in itertools.pairwise(firsts) if rate(b)]


def rank_rows(keys: list[str], rows: Sequence[dict]) -> Ranking:
    """``rows`` ranked (``rank`` and ``lead``, the rate over the next row's, added to each),
    apart from those without a rate and the failed; the worker count to use where swept."""
    ranking = Ranking(keys)
    for row in rows:
        if row.get("status") == "failed":
            ranking.failed.append(row)
        elif row.get("status") != "ok":
            ranking.stopped.append(row)
        elif rate(row) is None:
            ranking.unrated.append(row)
        else:
            ranking.ranked.append(row)
    ranking.ranked.sort(key=lambda r: -(rate(r) or 0.0))
    for place, row in enumerate(ranking.ranked):
        below = ranking.ranked[place + 1] if place + 1 < len(ranking.ranked) else None
        row["rank"] = place + 1
        row["lead"] = rate(row) / rate(below) if below is not None and rate(below) else None
    if WORKERS_KEY in keys:
        ranking.workers = choose_workers(keys, ranking.ranked)
    for choice in ranking.workers:
        choice.chosen["workers_choice"] = "use"
    return ranking


def within_spread(row: dict, best: dict) -> bool:
    """Whether ``row``'s rate and ``best``'s overlap, each give or take its spread (none
    known: the rate itself)."""
    low_best = rate(best) * (1 - (best.get(SPREAD) or 0.0))
    high_row = rate(row) * (1 + (row.get(SPREAD) or 0.0))
    return high_row >= low_best


def group_name(row: dict, keys: list[str]) -> str:
    """``key=value`` of ``row`` for the swept keys but the worker count."""
    return ",".join(f"{k}={row.get(k)}" for k in keys if k != WORKERS_KEY)


def _workers(row: dict) -> int | None:
    value = row.get("num_workers")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def choose_workers(keys: list[str], ranked: Sequence[dict]) -> list[WorkersChoice]:
    """For each value of the other swept keys: the fewest workers within the best's spread."""
    groups: dict[str, list[dict]] = {}
    for row in ranked:
        if _workers(row) is not None and row.get("loader") != RESIDENT:
            groups.setdefault(group_name(row, keys), []).append(row)
    choices = []
    for group, members in groups.items():
        members = sorted(members, key=lambda r: _workers(r) or 0)
        best = max(members, key=lambda r: rate(r) or 0.0)
        chosen = next(r for r in members if within_spread(r, best))
        choices.append(WorkersChoice(group, members, chosen, best))
    return choices


def is_loader_key(key: str) -> bool:
    return key in LOADER_KEYS
