"""Config composition: every option of every group composes; bad overrides fail naming the key."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from loaderbench.loaders import loader_names, settings_class
from loaderbench.run._validation import ConfigError, validate_config
from loaderbench.run.compose import NAMED_MODELS
from tests.helpers import CONF, compose_cfg

GROUPS = ["dataset", "loader", "model", "device", "precision", "logger"]
# Options that need a value the user must supply.
REQUIRED = {
    ("dataset", "folder"): ["dataset.root=/some/where"],
    ("dataset", "imagenet_flist"): [
        "dataset.root=/r",
        "dataset.train_list=t",
        "dataset.val_list=v",
    ],
}


def options(group: str) -> list[str]:
    """A group's YAML files, and for `model` the timm names registered in
    loaderbench.config.schema."""
    names = {p.stem for p in (CONF / group).glob("*.yaml")}
    if group == "model":
        names |= set(NAMED_MODELS)
    return sorted(names)


@pytest.mark.parametrize("config", ["train", "eval"])
@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes(config: str, group: str, option: str) -> None:
    extra = REQUIRED.get((group, option), [])
    cfg = compose_cfg(config, [f"{group}={option}", *extra])
    if group == "device":
        assert cfg.device.type == option
    elif (group, option) == ("model", "timm"):
        assert cfg.model.name == "resnet18"
    else:
        assert cfg[group].name == option
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    validate_config(cfg)


def test_defaults() -> None:
    cfg = compose_cfg("train", [])
    assert cfg.loader.name == "torchvision"
    assert cfg.dataset.name == "synthetic" and cfg.dataset.root is None
    assert cfg.model.pretrained is False
    assert cfg.logger.name == "wandb"
    assert cfg.device.type == "auto" and cfg.precision.name == "fp32"


def test_dataset_root_alone_points_at_the_folder() -> None:
    cfg = compose_cfg("train", ["dataset.root=/data/imagenet"])
    assert cfg.dataset.root == "/data/imagenet"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("loader.batch_size=abc", "loader.batch_size"),
        ("loader.bogus=1", "loader.bogus"),
        ("epochs=many", "epochs"),
        ("model.pretrained=maybe", "model.pretrained"),
        ("optim.lr=fast", "optim.lr"),
        ("nonsense=1", "nonsense"),
    ],
)
def test_bad_override_fails_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose_cfg("train", [override])
    text = str(info.value) + str(info.value.__cause__ or "")
    assert key.split(".")[-1] in text


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("+loader.bogus=1", "bogus"),
        ("loader.num_workers=-1", "loader.num_workers"),
        ("loader.batch_size=0", "loader.batch_size"),
        ("dataset.on_error=ignore", "dataset.on_error"),
        ("dataset.max_images=0", "dataset.max_images"),
        ("dataset.max_image_pixels=0", "dataset.max_image_pixels"),
        ("augment.scale=[0.5,0.1]", "augment.scale"),
        ("loader=memmap loader.train_store_ratio=0.5", "loader.train_store_ratio"),
    ],
)
def test_validation_names_the_key(override: str, key: str) -> None:
    cfg = compose_cfg("train", override.split())
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(cfg)


def test_an_unknown_decoder_is_refused_naming_the_choices() -> None:
    cfg = compose_cfg("train", ["loader=spdl", "loader.decoder=nvdec"])
    with pytest.raises(ConfigError, match=r"loader\.decoder must be one of .*'ffmpeg'.*'nvdec'"):
        validate_config(cfg)


@pytest.mark.parametrize("name", loader_names())
def test_a_loader_gets_its_typed_settings_once_with_the_schema_defaults(name: str) -> None:
    cfg = compose_cfg("train", [f"loader={name}", "loader.batch_size=7"])
    settings = validate_config(cfg).loader
    schema = settings_class(name)
    assert type(settings) is schema and settings.name == name and settings.batch_size == 7
    # Every other key holds the schema's default: the YAML only picks the schema.
    defaults = schema(name=name, batch_size=7)
    assert settings == defaults


def test_loader_packages_are_the_loaders() -> None:
    assert set(loader_names()) == {"memmap", "resident", "spdl", "torchvision"}
    assert set(options("loader")) == set(loader_names())


def test_a_timm_architecture_by_name() -> None:
    cfg = compose_cfg("train", ["model=timm", "model.name=convnext_atto"])
    assert cfg.model.name == "convnext_atto" and cfg.model.pretrained is False
    assert compose_cfg("train", ["model=resnet50"]).model.name == "resnet50"
