"""The config layer: the run's typed schemas (``schema``) and the keys every loader shares
(``loader``), pure dataclasses that import nothing of the project. Hydra composes the YAML under
``conf/`` against them; ``loaderbench.run._validation`` types and checks the composed node."""

from loaderbench.config.checks import (
    ConfigError,
    require,
    require_one_of,
    require_range_pair,
    require_timeout,
)
from loaderbench.config.loader import AUTO, AutotuneSettings, LoaderSettings, is_worker_count
from loaderbench.config.schema import (
    INDEX_CHECKS,
    ON_ERROR,
    SCHEMAS,
    AugmentConfig,
    BenchConfig,
    DatasetConfig,
    DeviceConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    RunConfig,
    RuntimeConfig,
    SchedulerConfig,
    SyntheticConfig,
    TrainLoopConfig,
)

__all__ = [
    "AUTO",
    "INDEX_CHECKS",
    "ON_ERROR",
    "SCHEMAS",
    "AugmentConfig",
    "AutotuneSettings",
    "BenchConfig",
    "ConfigError",
    "DatasetConfig",
    "DeviceConfig",
    "LoaderSettings",
    "LoggerConfig",
    "ModelConfig",
    "OptimConfig",
    "PrecisionConfig",
    "RunConfig",
    "RuntimeConfig",
    "SchedulerConfig",
    "SyntheticConfig",
    "TrainLoopConfig",
    "is_worker_count",
    "require",
    "require_one_of",
    "require_range_pair",
    "require_timeout",
]
