"""Every environment variable eagle-zoo reads: its own EAGLE_ZOO_* ones, then those of
other tools it honours (huggingface_hub's, torchrun's, CUDA's, Triton's). No other module
reads the environment.

Each variable is read when its function is called, not at import, so a process (or a
test) may set it after importing eagle_zoo. What a user sets for one engine is an
``LLM(...)`` / command-line argument (``async_scheduling``, ``enforce_eager``, ...);
the variables here are process-wide settings and the plumbing between processes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

# Process-wide default of LLM(async_scheduling=None) and `eagle-zoo serve`'s
# --async-scheduling: 0 / false / no / off or 1 / true / yes / on (any other value is
# refused). Unset: on for one CUDA device, off on the CPU; never on with tensor parallelism.
ASYNC_SCHEDULING = "EAGLE_ZOO_ASYNC_SCHEDULING"
# eagle-zoo's cache directory: the default target's checkpoint converted from its GGUF
# (default_target.py) and the compiled CPU kernels (kernels/cpu_decode.py). Unset or empty:
# $XDG_CACHE_HOME/eagle_zoo, or ~/.cache/eagle_zoo where that is unset or empty too.
CACHE = "EAGLE_ZOO_CACHE"
# `eagle-zoo serve`'s default --api-key: every route but /health then needs
# "Authorization: Bearer <key>".
API_KEY = "EAGLE_ZOO_API_KEY"
# 1 / true / yes / on: load no entry-point plugins at all (the built-in families still
# load); 0 / false / no / off or unset: load them (any other value is refused).
DISABLE_PLUGIN_AUTOLOAD = "EAGLE_ZOO_DISABLE_PLUGIN_AUTOLOAD"
# name1,name2: load only these entry-point plugins.
PLUGINS = "EAGLE_ZOO_PLUGINS"
# Seconds a tensor-parallel driver waits for the worker processes it started to load
# their models and join (default 900).
TP_START_TIMEOUT = "EAGLE_ZOO_TP_START_TIMEOUT"
# Internal: set by the tensor-parallel driver in the environment of each worker it
# starts (engine/parallel.py), the worker's rank; not a user setting.
TP_RANK = "EAGLE_ZOO_TP_RANK"

VARIABLES = (ASYNC_SCHEDULING, CACHE, API_KEY, DISABLE_PLUGIN_AUTOLOAD, PLUGINS, TP_START_TIMEOUT, TP_RANK)

# Other tools' variables, read with the meaning those tools give them:
# HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE (1 / on / yes / true): resolve hub ids from the
# local cache only (hub.py). HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME:
# where huggingface_hub's cache is, by huggingface_hub's precedence.
HUB_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
HUB_CACHE = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
HF_HOME = "HF_HOME"
XDG_CACHE_HOME = "XDG_CACHE_HOME"
# torchrun's: a process it started is one rank of a tensor-parallel job (engine/parallel.py).
WORLD_SIZE, RANK, LOCAL_RANK = "WORLD_SIZE", "RANK", "LOCAL_RANK"
# CUDA's: which GPUs the process sees; quoted in the error when too few are visible.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# Triton's: 1 runs kernels in its interpreter, which has no programmatic dependent launch.
TRITON_INTERPRET = "TRITON_INTERPRET"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _switch(name: str) -> Optional[bool]:
    """A yes / no variable as a bool, None when unset or empty; any other value is refused."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    if value:
        raise ValueError(f"{name}={os.environ[name]!r}: use 1 / true / yes / on or "
                         "0 / false / no / off, or unset it for the default")
    return None


def async_scheduling() -> Optional[bool]:
    """EAGLE_ZOO_ASYNC_SCHEDULING as a bool, None when unset or empty."""
    return _switch(ASYNC_SCHEDULING)


def cache_dir() -> Path:
    if os.environ.get(CACHE):
        return Path(os.environ[CACHE])
    return _xdg_cache_home() / "eagle_zoo"


def _xdg_cache_home() -> Path:
    # An empty XDG_CACHE_HOME counts as unset (the XDG spec), never a path relative to the
    # working directory.
    return Path(os.environ.get(XDG_CACHE_HOME) or Path.home() / ".cache")


def api_key() -> Optional[str]:
    return os.environ.get(API_KEY)


def plugin_autoload_disabled() -> bool:
    return bool(_switch(DISABLE_PLUGIN_AUTOLOAD))


def plugin_allow_list() -> Optional[str]:
    """EAGLE_ZOO_PLUGINS as given (comma-separated names), None when unset."""
    return os.environ.get(PLUGINS)


def tp_start_timeout_s() -> float:
    value = os.environ.get(TP_START_TIMEOUT, "900")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{TP_START_TIMEOUT}={value!r}: give a number of seconds (default 900)") from None


def tp_rank() -> Optional[int]:
    """The rank a tensor-parallel driver gave this worker process, None elsewhere."""
    value = os.environ.get(TP_RANK)
    return int(value) if value else None


def hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in HUB_OFFLINE)


def hub_cache_dir() -> Path:
    """huggingface_hub's cache directory, by the same precedence huggingface_hub uses."""
    for var in HUB_CACHE:
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get(HF_HOME):
        return Path(os.path.expandvars(os.environ[HF_HOME])).expanduser() / "hub"
    return _xdg_cache_home() / "huggingface" / "hub"


def torchrun_world_size() -> int:
    """torchrun's WORLD_SIZE, 1 where it is unset."""
    return int(os.environ.get(WORLD_SIZE) or 1)


def torchrun_rank() -> int:
    """torchrun's RANK, 0 where it is unset."""
    return int(os.environ.get(RANK) or 0)


def torchrun_local_rank() -> Optional[int]:
    """torchrun's LOCAL_RANK, None where it is unset."""
    value = os.environ.get(LOCAL_RANK)
    return int(value) if value else None


def cuda_visible_devices() -> Optional[str]:
    return os.environ.get(CUDA_VISIBLE_DEVICES)


def triton_interpret() -> bool:
    return os.environ.get(TRITON_INTERPRET, "0") == "1"
