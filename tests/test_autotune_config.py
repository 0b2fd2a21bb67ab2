"""``loader.num_workers=auto`` in the configuration: a bad worker count or autotune key is
refused naming the key, and every loader accepts ``auto``. The ladder, the climb, the choice and
the probe: tests/test_autotune.py."""

from __future__ import annotations

import pytest

from loaderbench.config.loader import AutotuneSettings
from loaderbench.loaders import loader_names
from loaderbench.run._validation import ConfigError, validate_config
from tests.test_config import compose_cfg


@pytest.mark.parametrize("value", ["-1", "many", "1.5", "true"])
def test_a_bad_num_workers_is_refused_naming_the_key(value: str) -> None:
    cfg = compose_cfg("train", [f"loader.num_workers={value}"])
    with pytest.raises(ConfigError, match=r"loader\.num_workers must be an integer >= 0 or 'auto'"):
        validate_config(cfg)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("loader.autotune.tolerance=1.0", "loader.autotune.tolerance"),
        ("loader.autotune.gain=-0.1", "loader.autotune.gain"),
        ("loader.autotune.window_s=0", "loader.autotune.window_s"),
        ("loader.autotune.min_batches=0", "loader.autotune.min_batches"),
        ("loader.autotune.max_probe_s=0", "loader.autotune.max_probe_s"),
        ("loader.autotune.confirm_within=1", "loader.autotune.confirm_within"),
    ],
)
def test_bad_autotune_keys_are_refused_naming_them(override: str, key: str) -> None:
    cfg = compose_cfg("train", ["loader=spdl", "loader.num_workers=auto", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(cfg)


def test_auto_is_accepted_by_every_loader() -> None:
    for name in loader_names():
        settings = validate_config(
            compose_cfg("train", [f"loader={name}", "loader.num_workers=auto"])
        ).loader
        assert settings.auto_workers and settings.autotune == AutotuneSettings()
