"""Evaluate a checkpoint and measure end-to-end throughput: ``python eval.py checkpoint=PATH``.

``model=none`` runs the validation pipeline alone: the loader benchmark. See README.md.
"""

import hydra
from omegaconf import DictConfig

import loaderbench.run.compose  # noqa: F401  (registers the config schemas)
from loaderbench.app import evaluate_checkpoint, run_job


@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return run_job(evaluate_checkpoint, cfg)


if __name__ == "__main__":
    main()
