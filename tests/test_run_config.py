"""One typed run config, converted once (issue 30, item 3): validation returns the whole run as
a ``RunConfig``, each dataclass carries its own range checks naming its key, a loader declares
its folders on disk, ``num_workers=auto``'s count lands in the one config object, and resume's
"same run?" rule is one table."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from loaderbench.config.loader import LoaderSettings
from loaderbench.config.schema import (
    SCHEMAS,
    AugmentConfig,
    BenchConfig,
    DatasetConfig,
    DeviceConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    RuntimeConfig,
    SchedulerConfig,
    TrainLoopConfig,
)
from loaderbench.loaders import loader_names, settings_class
from loaderbench.run._records import RUN_CONFIG_FILE
from loaderbench.run._resume_rules import (
    MAY_DIFFER,
    MUST_MATCH,
    RESUME_RULES,
    changed_kept_keys,
    same_run,
)
from loaderbench.run._validation import ConfigError, validate_config
from loaderbench.run.session import evict_page_cache, prepare_page_cache
from tests.conftest import folder_index, loader_folders, single_run
from tests.helpers import compose_cfg
from tests.in_process import run_here

# ---------------------------------------------------------------------------------------------
# Validation returns the whole run, typed.


@pytest.mark.parametrize("task", ["train", "eval"])
@pytest.mark.parametrize("loader", loader_names())
def test_validation_returns_the_whole_typed_run_config(task: str, loader: str) -> None:
    cfg = compose_cfg(task, [f"loader={loader}", "optim.lr=0.05", "bench.max_batches=3"])
    run = validate_config(cfg)
    assert isinstance(run, RunConfig) and run.task == task
    for group, schema in {**SCHEMAS, "loader": settings_class(loader)}.items():
        assert type(getattr(run, group)) is schema, group
    assert run.optim.lr == 0.05 and run.bench.max_batches == 3
    # Every key of the composed config, and nothing else: the typed object is the whole run.
    assert dataclasses.asdict(run) == OmegaConf.to_container(cfg, resolve=True)


# One bad value in every group (and at the top), each refused naming its key.
BAD_VALUES = [
    ("image_size=4", "image_size"),
    ("epochs=0", "epochs"),
    ("bench.warmup_batches=-1", "bench.warmup_batches"),
    ("bench.max_batches=0", "bench.max_batches"),
    ("augment.scale=[2,1]", "augment.scale"),
    ("augment.ratio=[0,1]", "augment.ratio"),
    ("train.stop_after_epochs=0", "train.stop_after_epochs"),
    ("logger.log_every_n_steps=0", "logger.log_every_n_steps"),
    ("runtime.threads=0", "runtime.threads"),
    ("dataset.max_images=0", "dataset.max_images"),
    ("dataset.on_error=ignore", "dataset.on_error"),
    ("loader.prefetch=0", "loader.prefetch"),
    ("loader.autotune.gain=-1", "loader.autotune.gain"),
    # Each a run the old code started and failed late in, or never failed at all (an unknown
    # optimizer under model=none, which builds none).
    ("optim.name=adamx", "optim.name"),
    ("optim.lr=0", "optim.lr"),
    ("optim.momentum=-0.1", "optim.momentum"),
    ("optim.weight_decay=-1", "optim.weight_decay"),
    ("optim.betas=[0.9,1.5]", "optim.betas"),
    ("scheduler.name=step", "scheduler.name"),
    ("scheduler.warmup_epochs=-1", "scheduler.warmup_epochs"),
    ("scheduler.min_lr_ratio=2", "scheduler.min_lr_ratio"),
    ("device.type=tpu", "device.type"),
    ("device.index=-1", "device.index"),
    ("precision.name=fp8", "precision.name"),
    ("model.drop_rate=1.5", "model.drop_rate"),
]


@pytest.mark.parametrize(("override", "key"), BAD_VALUES)
def test_a_bad_value_in_any_group_is_refused_naming_its_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"(^|; ){re.escape(key)} must be"):
        validate_config(compose_cfg("train", [override, "model=none"]))


def test_every_group_carries_range_checks() -> None:
    """Every group's schema checks its ranges in ``__post_init__`` (a new group without checks
    fails here), but ``precision``, whose one key is a registry's name (checked by
    ``validate_config``, above the schemas, as the optimiser's and the device's are)."""
    unchecked = [group for group, schema in SCHEMAS.items() if "__post_init__" not in vars(schema)]
    assert unchecked == ["precision"]


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("optim.name=adamx", "['adamw', 'sgd']"),
        ("scheduler.name=step", "['constant', 'cosine']"),
        ("device.type=tpu", "['auto', 'cpu', 'cuda']"),
        ("precision.name=fp8", "['bf16', 'fp16', 'fp32']"),
    ],
)
def test_a_name_out_of_its_registry_is_refused_naming_the_choices(
    override: str, allowed: str
) -> None:
    key, value = override.split("=")
    expected = f"{key} must be one of {allowed}, got '{value}'"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        validate_config(compose_cfg("eval", [override, "model=none"]))


@pytest.mark.parametrize(
    ("schema", "values", "key"),
    [
        (BenchConfig, {"warmup_batches": -1}, "bench.warmup_batches"),
        (BenchConfig, {"max_batches": 0}, "bench.max_batches"),
        (AugmentConfig, {"scale": [2.0, 1.0]}, "augment.scale"),
        (TrainLoopConfig, {"stop_after_epochs": 0}, "train.stop_after_epochs"),
        (LoggerConfig, {"log_every_n_steps": 0}, "logger.log_every_n_steps"),
        (RuntimeConfig, {"threads": 0}, "runtime.threads"),
        (DatasetConfig, {"name": "folder", "max_image_pixels": 0}, "dataset.max_image_pixels"),
        (OptimConfig, {"lr": -1.0}, "optim.lr"),
        (SchedulerConfig, {"warmup_epochs": -1.0}, "scheduler.warmup_epochs"),
        (DeviceConfig, {"index": -1}, "device.index"),
        (ModelConfig, {"name": "resnet18", "drop_rate": -0.1}, "model.drop_rate"),
    ],
)
def test_each_dataclass_carries_its_own_range_checks(
    schema: type, values: dict[str, object], key: str
) -> None:
    """The checks live on the dataclass: a piece built in code is refused alike, naming its
    key, and its defaults pass."""
    with pytest.raises(ConfigError, match=f"^{re.escape(key)} must be"):
        schema(**values)
    schema(**{k: v for k, v in values.items() if k == "name"})


# ---------------------------------------------------------------------------------------------
# A loader's folders on disk.


def test_a_loader_declares_its_folders() -> None:
    assert LoaderSettings(name="x").folders() == ()
    assert settings_class("torchvision")(name="torchvision").folders() == ()
    memmap = settings_class("memmap")(name="memmap", cache_dir="/scratch/caches")
    assert memmap.folders() == ("/scratch/caches",)
    # One declaration, the keys: what folders() reads and the tests redirect, whatever their
    # names (the contract's throw-away loader declares loader.scratch).
    assert settings_class("memmap").folder_keys() == ("cache_dir",)
    for name in loader_names():
        keys = settings_class(name).folder_keys()
        assert set(loader_folders(name, Path("/t"))) == set(keys), name


def _evicted(caplog: pytest.LogCaptureFixture) -> int:
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evicted")]
    return int(line.split()[1])


def test_a_cold_run_evicts_the_folders_the_loader_declares(
    tiny_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``bench.drop_page_cache=true`` evicts the images and every file of the loader's
    declared folders (memmap's cache), whatever the loader's key is called."""
    dataset = folder_index(tiny_root)
    images = len(dataset.train) + len(dataset.val)
    cache = tmp_path / "cache"
    (cache / "store").mkdir(parents=True)
    for name in ("a.bin", "b.bin", "store/c.bin"):
        (cache / name).write_bytes(b"x" * 100)
    memmap = settings_class("memmap")(name="memmap", cache_dir=str(cache))
    caplog.set_level(logging.INFO, logger="loaderbench.run.session")
    assert prepare_page_cache(BenchConfig(drop_page_cache=True), dataset, memmap) == "cold"
    assert _evicted(caplog) == images + 3
    caplog.clear()
    evict_page_cache(dataset, settings_class("torchvision")(name="torchvision").folders())
    assert _evicted(caplog) == images
    caplog.clear()
    auto = dataclasses.replace(memmap, num_workers="auto")  # left to after the probe
    assert prepare_page_cache(BenchConfig(drop_page_cache=True), dataset, auto) == "cold"
    assert not caplog.records
    assert prepare_page_cache(BenchConfig(), dataset, memmap) == "warm"


# ---------------------------------------------------------------------------------------------
# num_workers=auto: the count in the one config object.


@pytest.mark.slow
def test_the_chosen_worker_count_is_written_into_the_run_config(
    tiny_root: Path, tmp_path: Path
) -> None:
    """A real train.py run with ``loader.num_workers=auto``: the run's one config object holds
    the count the probe chose (``run_config.json``, written from it), the one metrics.json
    reports, and the device ``device=auto`` resolved to; Hydra's record keeps what was asked."""
    run_here(
        "train.py",
        "model=none",
        f"dataset.root={tiny_root}",
        "dataset.index_dir=null",
        "logger=none",
        "device=auto",
        "image_size=32",
        "loader=torchvision",
        "loader.batch_size=4",
        "loader.num_workers=auto",
        "loader.autotune.window_s=0.3",
        "loader.autotune.min_batches=4",
        cwd=tmp_path,
    )
    run_dir, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["num_workers_auto"] is True
    ran = json.loads((run_dir / RUN_CONFIG_FILE).read_text())
    assert isinstance(metrics["num_workers"], int)
    assert ran["loader"]["num_workers"] == metrics["num_workers"]
    assert ran["loader"]["name"] == "torchvision" and ran["image_size"] == 32
    assert ran["device"]["type"] == metrics["device"].split(":")[0]  # cpu here, cuda on a GPU
    asked = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert asked["loader"]["num_workers"] == "auto" and asked["device"]["type"] == "auto"


# ---------------------------------------------------------------------------------------------
# Resume's "same run?" rule, one table.


def test_the_resume_rule_table() -> None:
    assert RESUME_RULES == {
        "checkpoint": MAY_DIFFER,
        "train.resume": MAY_DIFFER,
        "loader.timeout_s": MAY_DIFFER,
        "seed": MUST_MATCH,
        "image_size": MUST_MATCH,
        "loader.batch_size": MUST_MATCH,
        "bench.max_batches": MUST_MATCH,
    }
    # Every key the table names is a key of the run config.
    composed = OmegaConf.to_container(compose_cfg("train", []), resolve=True)
    for key in RESUME_RULES:
        head, _, leaf = key.rpartition(".")
        assert leaf in (composed[head] if head else composed), key


def _config(**changes: object) -> dict:
    config = OmegaConf.to_container(compose_cfg("train", []), resolve=True)
    for key, value in changes.items():
        head, _, leaf = key.replace("__", ".").rpartition(".")
        (config[head] if head else config)[leaf] = value
    return config


def test_a_requeued_run_continues_only_its_own_config() -> None:
    saved = _config()
    assert same_run(_config(checkpoint="/elsewhere.pt", train__resume=True), saved)
    assert not same_run(_config(optim__lr=0.01), saved)  # any other key: another run
    assert not same_run(_config(seed=1), saved)
    assert saved == _config()  # the rule reads, never changes, what it compares


def test_an_asked_resume_may_change_all_but_the_keys_that_must_match() -> None:
    saved = _config()
    assert changed_kept_keys(_config(optim__lr=0.01, epochs=30), saved) == []
    changed = changed_kept_keys(_config(loader__batch_size=64, seed=3), saved)
    assert changed == [("seed", 3, 0), ("loader.batch_size", 64, saved["loader"]["batch_size"])]


def test_the_recorded_version_is_pyprojects() -> None:
    """run_config.json and W&B record ``VERSION``: it must be the version pyproject.toml ships."""
    import tomllib
    from pathlib import Path

    from loaderbench.platform.version import VERSION

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    assert VERSION == tomllib.loads(pyproject.read_text())["project"]["version"]
