"""The hooks a plugin may implement.

Every hook is a register-callback hook: the plugin receives ``register`` and calls it
once per thing it contributes. The host (eagle_zoo.plugins) owns the bookkeeping, so
aliases, duplicates and error messages are handled in one place for built-in and
third-party plugins alike.
"""
import pluggy

PROJECT = "eagle_zoo"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_families(register):
    """Register model families: ``register(FamilySpec(...))``.

    A family names the target architectures it serves, its target model class,
    its EAGLE and EAGLE-3 head classes and its weight mapping table.
    """


@hookspec
def register_formats(register):
    """Register checkpoint formats: ``register(CheckpointFormat(...))``.

    A format has a detector (does this directory hold my layout?) and a reader
    (config + tensors in the zoo's canonical naming).
    """


@hookspec
def register_catalog(register):
    """Register catalog entries: ``register(entry_dict_or_CatalogEntry)``."""


@hookspec
def register_proposers(register):
    """Register proposer methods: ``register(ProposerSpec(...))``."""
