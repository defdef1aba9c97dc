"""The entry point eagle-zoo loads: ``[project.entry-points.eagle_zoo] qwen2 = "eagle_zoo_qwen2.plugin"``.

Two register-callback hooks (eagle_zoo.hookspecs); eagle-zoo attributes everything
registered here to the plugin "qwen2" and refuses names another plugin already owns.
"""
from __future__ import annotations

from pathlib import Path

from eagle_zoo import hookimpl
from eagle_zoo.catalog import load_catalog_file
from eagle_zoo.specs import FamilySpec

from .mapping import QWEN2_MAPPING
from .modeling import Qwen2Eagle3Head, Qwen2EagleHead, Qwen2ForCausalLM, qwen2_config

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")

QWEN2_FAMILY = FamilySpec(
    name="qwen2",
    # Target architectures served; eagle-zoo derives the head names from them
    # (EagleQwen2ForCausalLM, Eagle3Qwen2ForCausalLM, Qwen2ForCausalLMEagle3).
    architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    target_model=Qwen2ForCausalLM,
    eagle_head=Qwen2EagleHead,
    eagle3_head=Qwen2Eagle3Head,
    weight_mapping=QWEN2_MAPPING,
    config_class=qwen2_config,
)


@hookimpl
def register_families(register):
    register(QWEN2_FAMILY)


@hookimpl
def register_catalog(register):
    for entry in load_catalog_file(CATALOG_FILE):
        register(entry)
