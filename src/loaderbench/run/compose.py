"""What Hydra composes against: the schemas of ``loaderbench.config.schema`` and each loader's keys
registered with Hydra's ConfigStore, and the resolvers the YAML under ``conf/`` uses.

Each config group under ``conf/`` pulls in its schema through its defaults list (``defaults:
[<group>_schema]``), so an override with a wrong type or an unknown key fails at composition
time, with OmegaConf's message naming the key. Importing this module registers them.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from loaderbench.config.schema import SCHEMAS, ModelConfig, RunConfig
from loaderbench.loaders import loader_names, settings_class
from loaderbench.platform.distributed import run_id

# The groups Hydra's config store takes a ``<group>_schema`` entry for (``conf/<group>/``).
STORED_GROUPS = ("dataset", "loader", "model", "device", "precision", "logger")

# `model=<name>` for these timm architectures, with no YAML file each (conf/model/timm.yaml
# takes any other name: `model=timm model.name=convnext_tiny`).
NAMED_MODELS = ("mobilenetv3_large_100", "resnet10t", "resnet18", "resnet50", "test_resnet")


def _run_stamp(default: str) -> str:
    """The run directory's last part: shared by every rank of one torchrun/SLURM launch, so
    they all write into one run directory; the time of day otherwise."""
    return run_id() or default


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    if not OmegaConf.has_resolver("run_stamp"):
        OmegaConf.register_new_resolver("run_stamp", _run_stamp)
    if not OmegaConf.has_resolver("if_cuda"):
        # The SLURM launchers' resources: GPUs only for device=cuda (conf/hydra/launcher/).
        OmegaConf.register_new_resolver(
            "if_cuda", lambda device, on_cuda, otherwise: on_cuda if device == "cuda" else otherwise
        )
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    for group in STORED_GROUPS:
        store.store(group=group, name=f"{group}_schema", node=SCHEMAS[group])
    for name in loader_names():  # each loader's own typed keys, from its package
        store.store(group="loader", name=f"{name}_schema", node=settings_class(name))
    for name in NAMED_MODELS:
        store.store(group="model", name=name, node=ModelConfig(name=name))


register_configs()
