"""eagle-zoo: EAGLE / EAGLE-3 draft heads, their plugin registry and a decoding engine.

Heavy pieces (torch models, the engine) are imported on first use so that
``eagle-zoo list`` and plugin discovery stay quick.
"""
from .hookspecs import hookimpl

__version__ = "0.1.0"

_LAZY = {
    "load": ("eagle_zoo.loading", "load"),
    "load_target": ("eagle_zoo.loading", "load_target"),
    "LoadedHead": ("eagle_zoo.loading", "LoadedHead"),
    "LLM": ("eagle_zoo.engine.llm", "LLM"),
    "SamplingParams": ("eagle_zoo.engine.sampling_params", "SamplingParams"),
    "EagleConfig": ("eagle_zoo.config.eagle_config", "EagleConfig"),
    "SpeculativeConfig": ("eagle_zoo.config.speculative", "SpeculativeConfig"),
    "get_registry": ("eagle_zoo.plugins", "get_registry"),
    "check_pending": ("eagle_zoo.plugins", "check_pending"),
}

__all__ = ["hookimpl", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'eagle_zoo' has no attribute {name!r}")
