"""The plugin manager: built-in and third-party plugins, and what each registered.

Built-in families, formats, proposers and the catalog are registered as plugins
through exactly the hooks a third-party package uses. Third-party packages are
found through the ``eagle_zoo`` entry-point group.

Environment (eagle_zoo/envs.py):
  EAGLE_ZOO_DISABLE_PLUGIN_AUTOLOAD=1  do not load entry-point plugins at all.
  EAGLE_ZOO_PLUGINS=name1,name2        load only these entry-point plugins.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Optional, Sequence

import pluggy

from . import envs, hookspecs
from .specs import CheckpointFormat, FamilySpec, ProposerSpec

ENTRY_POINT_GROUP = "eagle_zoo"
DISABLE_AUTOLOAD_ENV = envs.DISABLE_PLUGIN_AUTOLOAD
ALLOW_LIST_ENV = envs.PLUGINS

# One module per built-in contribution; each defines @hookimpl functions.
DEFAULT_PLUGINS = (
    "eagle_zoo.models.llama",
    "eagle_zoo.models.qwen3",
    "eagle_zoo.models.mistral",
    "eagle_zoo.models.deepseek",
    "eagle_zoo.models.llama4",
    "eagle_zoo.models.cohere",
    "eagle_zoo.models.mistral_large3",
    "eagle_zoo.checkpoints.formats",
    "eagle_zoo.checkpoints.mistral_native",
    "eagle_zoo.engine.proposers",
    "eagle_zoo.catalog",
)


class PluginError(RuntimeError):
    """A plugin could not be loaded or registered something inconsistent."""


@dataclass
class PluginInfo:
    name: str
    version: str
    source: str  # "builtin" or "entry point <dist>"
    registered: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Registry:
    """Everything the plugins registered, indexed for lookup."""

    families: dict[str, FamilySpec] = field(default_factory=dict)
    architectures: dict[str, FamilySpec] = field(default_factory=dict)
    model_types: dict[str, FamilySpec] = field(default_factory=dict)
    head_architectures: dict[str, tuple[FamilySpec, str]] = field(default_factory=dict)
    formats: dict[str, CheckpointFormat] = field(default_factory=dict)
    proposers: dict[str, ProposerSpec] = field(default_factory=dict)
    catalog: dict[str, Any] = field(default_factory=dict)
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)

    # -- lookups with errors a user can act on --------------------------------
    def family(self, name: str) -> FamilySpec:
        try:
            return self.families[name]
        except KeyError:
            raise KeyError(
                f"unknown model family {name!r}; registered families: "
                f"{', '.join(sorted(self.families))}. A family comes from a plugin: "
                f"install one that registers it (see docs/writing-a-plugin.md)."
            ) from None

    def family_for_architecture(self, arch: str) -> FamilySpec:
        if arch in self.architectures:
            return self.architectures[arch]
        raise KeyError(
            f"no plugin registers the target architecture {arch!r}; supported: "
            f"{', '.join(sorted(self.architectures))}"
        )

    def family_for_config(self, config: Any) -> FamilySpec:
        archs = list(_get(config, "architectures") or [])
        for arch in archs:
            if arch in self.architectures:
                return self.architectures[arch]
        model_type = _get(config, "model_type")
        if model_type in self.model_types:
            return self.model_types[model_type]
        raise KeyError(
            f"no registered family serves architectures={archs} model_type={model_type!r}; "
            f"supported architectures: {', '.join(sorted(self.architectures))}"
        )

    def head_for_architecture(self, arch: str) -> tuple[FamilySpec, str]:
        """Resolve a renamed head architecture (EagleLlamaForCausalLM) to (family, method)."""
        if arch in self.head_architectures:
            return self.head_architectures[arch]
        raise KeyError(
            f"no plugin provides a head for architecture {arch!r}; known head "
            f"architectures: {', '.join(sorted(self.head_architectures))}"
        )

    def head_class(self, arch: str) -> type:
        family, method = self.head_for_architecture(arch)
        cls = family.head_class(method)
        if cls is None:
            raise KeyError(f"family {family.name!r} registers no {method} head (architecture {arch!r})")
        return cls

    def proposer(self, method: str) -> ProposerSpec:
        if method in self.proposers:
            return self.proposers[method]
        raise KeyError(
            f"unknown speculative method {method!r}; registered methods: "
            f"{', '.join(sorted(self.proposers))}"
        )


def _get(config: Any, key: str, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def head_architecture_names(arch: str) -> dict[str, str]:
    """Renamed head architectures derived from a target architecture."""
    from .config.eagle_config import rename_architecture

    names = {rename_architecture(arch, "eagle"): "eagle", rename_architecture(arch, "eagle3"): "eagle3"}
    names[f"{arch}Eagle3"] = "eagle3"
    return names


class PluginHost:
    """Owns the pluggy manager, loads plugins and builds the Registry."""

    def __init__(self, autoload: Optional[bool] = None, default_plugins: Sequence[str] = DEFAULT_PLUGINS):
        # default_plugins: the built-in modules to register; tests pass a subset to
        # exercise the host without depending on which families exist.
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._registry: Optional[Registry] = None
        self._meta: dict[str, tuple[str, str]] = {}  # plugin name -> (version, source)
        self._autoload = autoload
        self._default_plugins = tuple(default_plugins)
        self._loaded = False

    # -- loading ---------------------------------------------------------------
    def load(self) -> None:
        if self._loaded:
            return
        from . import __version__

        for modname in self._default_plugins:
            module = importlib.import_module(modname)
            if self.pm.get_plugin(modname) is None:
                self.pm.register(module, name=modname)
                self._meta[modname] = (__version__, "builtin")
        autoload = self._autoload
        if autoload is None:
            autoload = not envs.plugin_autoload_disabled()
        if autoload:
            self._load_entry_points()
        self.check_pending()
        # Only now: a failed load must not leave a half-loaded host that looks ready.
        self._loaded = True

    def check_pending(self) -> None:
        """Fail loudly when a plugin implements a hook that does not exist (a typo
        such as ``register_familes`` would otherwise be silently never called)."""
        known = sorted(n for n, c in vars(self.pm.hook).items() if not n.startswith("_") and c.has_spec())
        for name, caller in vars(self.pm.hook).items():
            if name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if impl.optionalhook:
                    continue
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise PluginError(
                    f"plugin {impl.plugin_name!r} implements unknown hook {name!r}.{hint} "
                    f"The hooks are: {', '.join(known)}."
                )

    def _load_entry_points(self) -> None:
        allow = envs.plugin_allow_list()
        allowed = None if allow is None else {n.strip() for n in allow.split(",") if n.strip()}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            if self.pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must say which one it is
                raise PluginError(
                    f"could not load eagle_zoo plugin {ep.name!r} ({ep.value}): {exc}. "
                    f"Fix or uninstall it, or set {DISABLE_AUTOLOAD_ENV}=1 / "
                    f"{ALLOW_LIST_ENV}=<names> to skip it."
                ) from exc
            try:
                self.pm.register(plugin, name=ep.name)
            except (ValueError, pluggy.PluginValidationError) as exc:
                raise PluginError(f"eagle_zoo plugin {ep.name!r} ({ep.value}) cannot be registered: {exc}") from exc
            dist = ep.dist
            self._meta[ep.name] = (
                dist.version if dist else "unknown",
                f"entry point of {dist.name if dist else '?'}",
            )

    def register(self, plugin: Any, name: Optional[str] = None, version: str = "0") -> str:
        """Register a plugin object or module at run time (tests, notebooks)."""
        self.load()
        try:
            name = self.pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"cannot register plugin {name or plugin!r}: {exc}") from exc
        try:
            self.check_pending()
        except PluginError:
            self.pm.unregister(name=name)  # leave the host as it was
            raise
        self._meta[name] = (version, "registered at run time")
        self._registry = None
        return name

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._meta.pop(name, None)
        self._registry = None

    # -- building the registry -------------------------------------------------
    @property
    def registry(self) -> Registry:
        self.load()
        if self._registry is None:
            self._registry = self._build()
        return self._registry

    def _build(self) -> Registry:
        reg = Registry()
        for name, plugin in self.pm.list_name_plugin():
            version, source = self._meta.get(name, ("unknown", "unknown"))
            reg.plugins[name] = PluginInfo(name, version, source)

        def call(hook_name: str, add: Callable[[str, Any], None]):
            hook = getattr(self.pm.hook, hook_name)
            # Call each implementation alone so every registration is attributed.
            for impl in reversed(hook.get_hookimpls()):
                plugin_name = impl.plugin_name
                kwargs = {"register": lambda item, _p=plugin_name: add(_p, item)}
                # pluggy lets an implementation take fewer arguments than the spec.
                impl.function(**{a: kwargs[a] for a in impl.argnames})

        call("register_families", lambda p, item: self._add_family(reg, p, item))
        call("register_formats", lambda p, item: self._add_named(reg, p, item, CheckpointFormat, reg.formats, "format"))
        call("register_proposers", lambda p, item: self._add_named(reg, p, item, ProposerSpec, reg.proposers, "proposer"))

        from .catalog import CatalogEntry, parse_entry

        def add_entry(p, item):
            # The entry is attributed to the plugin that registered it, whatever
            # source a pre-built CatalogEntry (load_catalog_file) carried.
            entry = dataclasses.replace(item, source=p) if isinstance(item, CatalogEntry) else parse_entry(item, source=p)
            self._claim(reg, p, "catalog entry", entry.id)
            reg.catalog[entry.id] = entry
            reg.plugins[p].registered.setdefault("catalog", []).append(entry.id)

        call("register_catalog", add_entry)
        return reg

    def _claim(self, reg: Registry, plugin: str, kind: str, key: str) -> None:
        owner = reg.owners.get((kind, key))
        if owner is not None and owner != plugin:
            raise PluginError(
                f"{kind} {key!r} is registered by two plugins: {owner!r} and {plugin!r}. "
                f"Uninstall one, or limit loading with {ALLOW_LIST_ENV}."
            )
        if owner == plugin:
            raise PluginError(f"plugin {plugin!r} registers {kind} {key!r} twice")
        reg.owners[(kind, key)] = plugin

    def _add_named(self, reg, plugin, item, cls, table, kind):
        if not isinstance(item, cls):
            raise PluginError(f"plugin {plugin!r} registered {item!r} as a {kind}; expected {cls.__name__}")
        self._claim(reg, plugin, kind, item.name)
        table[item.name] = item
        plural = "families" if kind == "family" else kind + "s"
        reg.plugins[plugin].registered.setdefault(plural, []).append(item.name)

    def _add_family(self, reg: Registry, plugin: str, fam: FamilySpec) -> None:
        self._add_named(reg, plugin, fam, FamilySpec, reg.families, "family")
        for arch in fam.architectures:
            self._claim(reg, plugin, "architecture", arch)
            reg.architectures[arch] = fam
            if fam.eagle_head is None and fam.eagle3_head is None:
                continue  # no heads: nothing to rename (and no need for the config module)
            for head_arch, method in head_architecture_names(arch).items():
                if fam.head_class(method) is not None:
                    self._claim(reg, plugin, "head architecture", head_arch)
                    reg.head_architectures[head_arch] = (fam, method)
        for head_arch, method in fam.extra_head_architectures:
            self._claim(reg, plugin, "head architecture", head_arch)
            reg.head_architectures[head_arch] = (fam, method)
        for mt in fam.model_types:
            self._claim(reg, plugin, "model_type", mt)
            reg.model_types[mt] = fam


_host: Optional[PluginHost] = None


def get_host() -> PluginHost:
    global _host
    if _host is None:
        _host = PluginHost()
    return _host


def get_registry() -> Registry:
    return get_host().registry


def check_pending() -> None:
    """Fail loudly when a plugin implements a hook that does not exist (a typo)."""
    get_host().load()
    get_host().check_pending()


def reset() -> None:
    """Forget loaded plugins (tests); the next get_registry() loads afresh."""
    global _host
    _host = None
