"""The zoo's own heads for SmolLM2-135M-Instruct, registered as catalog entries whose
weights ship inside this package (the catalog's `path` field)."""
from pathlib import Path

from eagle_zoo import hookimpl
from eagle_zoo.catalog import load_catalog_file

CATALOG = Path(__file__).with_name("catalog.yaml")


@hookimpl
def register_catalog(register):
    for entry in load_catalog_file(CATALOG):
        register(entry)
