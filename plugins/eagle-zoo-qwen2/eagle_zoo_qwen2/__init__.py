"""eagle-zoo-qwen2: the Qwen2 / Qwen2.5 family as an installable eagle-zoo plugin.

eagle-zoo finds this package through the ``eagle_zoo`` entry point declared in
pyproject.toml (``qwen2 = "eagle_zoo_qwen2.plugin"``); nothing in eagle_zoo names it.

Modules, one job each:
  mapping.py   checkpoint names -> this package's parameters (a table, data only)
  quirks.py    what published Qwen2 EAGLE heads do differently from plain HF configs
  modeling.py  attention, decoder layer, target model, EAGLE / EAGLE-3 heads
  plugin.py    the @hookimpl functions eagle-zoo calls (family + catalog)
  catalog.yaml the published heads for Qwen2 / Qwen2.5 targets
"""
from importlib import metadata

try:
    __version__ = metadata.version("eagle-zoo-qwen2")
except metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
