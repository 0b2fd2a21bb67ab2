"""The range checks of the schemas: each dataclass checks its keys in ``__post_init__`` and
raises a ``ConfigError`` naming the key, so no object of a schema holds a value outside its
range, however it was made (composed by Hydra, replaced, or built in a script)."""

from __future__ import annotations

import math
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config key outside its allowed set or range, or a config that cannot run: the message
    names the key."""


def require(holds: bool, rule: str, value: object) -> None:
    """``ConfigError("<rule>, got <value>")`` unless ``holds``; ``rule`` names the key."""
    if not holds:
        raise ConfigError(f"{rule}, got {value!r}")


def require_one_of(value: object, choices: Iterable[str], key: str) -> None:
    """``value`` among ``choices`` (the names a registry knows)."""
    names = sorted(choices)
    require(value in names, f"{key} must be one of {names}", value)


def require_range_pair(values: list[float], key: str) -> None:
    """``values`` as two numbers ``0 < low <= high``."""
    pair = list(values)
    ok = len(pair) == 2 and 0 < pair[0] <= pair[1]
    require(ok, f"{key} must be two numbers 0 < low <= high", pair)


def require_timeout(seconds: float | None, key: str) -> None:
    """A timeout: a finite number of seconds > 0, or null (wait for ever)."""
    ok = seconds is None or (math.isfinite(seconds) and seconds > 0)
    require(ok, f"{key} must be > 0 (finite) or null", seconds)
