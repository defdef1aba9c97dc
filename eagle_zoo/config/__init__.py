"""Configs: EagleConfig (a head's config.json) and SpeculativeConfig (the user's options)."""
from .eagle_config import EagleConfig, is_eagle3_architecture, rename_architecture
from .speculative import (
    Inference,
    SpeculativeConfig,
    SpeculativeConfigError,
    TreeConfig,
    infer_method,
    read_local_config,
)

__all__ = [
    "EagleConfig",
    "Inference",
    "SpeculativeConfig",
    "SpeculativeConfigError",
    "TreeConfig",
    "infer_method",
    "is_eagle3_architecture",
    "read_local_config",
    "rename_architecture",
]
