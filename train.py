"""Train a timm model with the chosen loader, then validate: ``python train.py [overrides]``.

``model=none`` runs the training pipeline (with its random augmentation) alone: the loader
benchmark. See README.md and conf/train.yaml.
"""

import hydra
from omegaconf import DictConfig

import loaderbench.run.compose  # noqa: F401  (registers the config schemas)
from loaderbench.app import run_job, train


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_job(train, cfg)


if __name__ == "__main__":
    main()
