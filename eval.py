"""Evaluate a checkpoint and measure end-to-end throughput: ``python eval.py checkpoint=PATH``.

``model=none`` runs the validation pipeline alone: the loader benchmark. See README.md.
"""

import hydra
from omegaconf import DictConfig

import loaderbench.config  # noqa: F401  (registers the config schemas)
from loaderbench.app import evaluate_checkpoint


@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return evaluate_checkpoint(cfg).get("top1")


if __name__ == "__main__":
    main()
