"""The project's version, as pyproject.toml gives it: what run_config.json and W&B record."""

VERSION = "0.1.0"
