"""The catalog: schema errors, the built-in registry.yaml, plugin entries, the CLI."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from eagle_zoo import catalog_cli, cli
from eagle_zoo.catalog import (
    FORMATS, CatalogEntry, CatalogError, load_catalog_file, parse_entry, registry_path,
)
from eagle_zoo.hookspecs import hookimpl
from eagle_zoo.plugins import PluginError, PluginHost

ROOT_REGISTRY = Path(__file__).resolve().parents[1] / "registry.yaml"
SIX_FAMILIES = {"llama", "qwen3", "mistral", "deepseek", "llama4", "cohere"}
GOOD = dict(id="acme/EAGLE3-Toy-1B", method="eagle3", family="llama",
            target="acme/Toy-1B", format="yuhuili-eagle3")


def catalog_host() -> PluginHost:
    """A host with only the built-in catalog plugin: independent of the families."""
    return PluginHost(autoload=False, default_plugins=("eagle_zoo.catalog",))


# -- schema --------------------------------------------------------------------
def test_good_entry_builds_with_defaults():
    e = parse_entry(dict(GOOD, acceptance_length=3, acceptance_setting="MT-bench, K=3"), source="p")
    assert e == CatalogEntry(**GOOD, acceptance_length=3.0, acceptance_setting="MT-bench, K=3", source="p")
    assert isinstance(e.acceptance_length, float) and e.notes == "" and e.revision is None


@pytest.mark.parametrize("change, field, allowed", [
    ({"method": "eagle2"}, "method", "eagle | eagle3"),
    ({"draft_vocab_size": "32000"}, "draft_vocab_size", "positive integer"),
    ({"draft_vocab_size": True}, "draft_vocab_size", "positive integer"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens", "positive integer"),
    ({"acceptance_length": 0.5, "acceptance_setting": "x"}, "acceptance_length", ">= 1"),
    ({"target": "just-a-name"}, "target", "owner/name"),
    ({"notes": 3}, "notes", "a string"),
])
def test_bad_value_names_entry_field_and_allowed(change, field, allowed):
    with pytest.raises(CatalogError) as err:
        parse_entry(dict(GOOD, **change), source="myplugin")
    msg = str(err.value)
    assert "'acme/EAGLE3-Toy-1B'" in msg and f"'{field}'" in msg and allowed in msg
    assert "myplugin" in msg


def test_missing_field_and_unknown_field():
    item = dict(GOOD)
    del item["target"]
    with pytest.raises(CatalogError, match=r"'acme/EAGLE3-Toy-1B'.*missing required field 'target'"):
        parse_entry(item, source="p")
    with pytest.raises(CatalogError, match=r"unknown field 'famly' \(did you mean 'family'\?\)"):
        parse_entry(dict(GOOD, famly="llama"), source="p")
    with pytest.raises(CatalogError, match="'source' is set by the plugin host"):
        parse_entry(dict(GOOD, source="me"), source="p")


def test_acceptance_length_needs_its_setting():
    with pytest.raises(CatalogError, match="'acceptance_setting' is required"):
        parse_entry(dict(GOOD, acceptance_length=2.5), source="p")


RECORD = dict(dataset="dev", num_prompts=300, device="cuda", dtype="bfloat16", batch=1, k=3,
              max_tokens=256, acceptance_length=2.85, speedup=1.9, hardware="1xH200")


def test_measured_records_build_and_match_their_setting():
    cpu = dict(RECORD, device="cpu", dtype="float32", batch=80, dataset="mt-bench", num_prompts=80)
    del cpu["speedup"]
    e = parse_entry(dict(GOOD, measured=[RECORD, cpu]), source="p")
    assert [r.speedup for r in e.measured] == [1.9, None]
    assert e.headline_acceptance == 2.85 and e.headline_speedup == 1.9
    first = e.measured[0]
    assert first.temperature == 0.0 and isinstance(first.acceptance_length, float)
    setting = dict(first.setting)
    assert e.find_measured(setting) is first
    assert e.find_measured(dict(setting, batch=80, device="cpu", dtype="float32", dataset="mt-bench",
                                num_prompts=80)) is e.measured[1]
    for key, other in [("dataset", "mt-bench"), ("num_prompts", 80), ("device", "cpu"), ("dtype", "float32"),
                       ("batch", 4), ("k", 2), ("max_tokens", 64), ("temperature", 0.7)]:
        assert e.find_measured(dict(setting, **{key: other})) is None, key
    assert "dev 300 prompts, cuda bfloat16, batch 1, k=3, 256 tokens, greedy: acceptance 2.850, " \
           "speed-up 1.90x; 1xH200" == first.describe()
    # without records, the headline is the published number
    plain = parse_entry(dict(GOOD, acceptance_length=2.5, acceptance_setting="x"), source="p")
    assert plain.measured == () and plain.headline_acceptance == 2.5 and plain.headline_speedup is None


@pytest.mark.parametrize("measured, message", [
    ({"dataset": "dev"}, r"field 'measured' must be a list of records"),
    (["dev"], r"measured\[0\]: expected a mapping"),
    ([dict(RECORD, devise="cuda")], r"measured\[0\]: unknown key 'devise' \(did you mean 'device'\?\)"),
    ([{k: v for k, v in RECORD.items() if k != "batch"}], r"measured\[0\]: missing required key 'batch'"),
    ([RECORD, dict(RECORD, device="tpu")], r"measured\[1\]: key 'device' must be one of cpu \| cuda; got 'tpu'"),
    ([dict(RECORD, dtype="bf16")], r"key 'dtype' must be one of float32 \| bfloat16 \| float16"),
    ([dict(RECORD, batch=0)], r"key 'batch' must be a positive integer \(--max-num-seqs\)"),
    ([dict(RECORD, k=True)], r"key 'k' must be a positive integer"),
    ([dict(RECORD, acceptance_length=0.9)], r"key 'acceptance_length' must be a number >= 1"),
    ([dict(RECORD, speedup=-1)], r"key 'speedup' must be a positive number"),
    ([RECORD, dict(RECORD, acceptance_length=2.0)], r"measured\[1\]: the same setting as measured\[0\]"),
])
def test_bad_measured_records_name_the_file_entry_record_and_key(tmp_path, measured, message):
    path = tmp_path / "cat.yaml"
    path.write_text(yaml.safe_dump({"entries": [dict(GOOD, measured=measured)]}))
    with pytest.raises(CatalogError, match=message) as err:
        load_catalog_file(path)
    assert str(path) in str(err.value) and "'acme/EAGLE3-Toy-1B'" in str(err.value)


def test_file_errors_name_file_and_entry_index(tmp_path):
    path = tmp_path / "cat.yaml"
    path.write_text(yaml.safe_dump({"entries": [GOOD, {"method": "eagle"}]}))
    with pytest.raises(CatalogError) as err:
        load_catalog_file(path)
    assert str(path) in str(err.value) and "entry #1" in str(err.value) and "'id'" in str(err.value)

    path.write_text(yaml.safe_dump({"entries": [GOOD, GOOD]}))
    with pytest.raises(CatalogError, match=r"'acme/EAGLE3-Toy-1B' appears twice \(#0 and #1\)"):
        load_catalog_file(path)
    path.write_text("- just a list\n")
    with pytest.raises(CatalogError, match="'entries:' list"):
        load_catalog_file(path)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog_file(tmp_path / "missing.yaml")


# -- the built-in registry.yaml ------------------------------------------------
def test_root_registry_is_what_the_package_reads():
    # Editable install: no copy inside the package, so the root file is used.
    assert registry_path().read_bytes() == ROOT_REGISTRY.read_bytes()


def test_root_registry_content():
    entries = {e.id: e for e in load_catalog_file(ROOT_REGISTRY)}
    for required in ("yuhuili/EAGLE-LLaMA3-Instruct-8B", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
                     "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                     "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"):
        assert required in entries
    # vLLM's acceptance regression (MT-bench 80 prompts, K=3, greedy, 1xH100).
    assert entries["yuhuili/EAGLE-LLaMA3.1-Instruct-8B"].acceptance_length == 2.296
    assert entries["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"].acceptance_length == 2.811
    assert entries["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"].draft_vocab_size == 32000
    # mistral_large3: the Mistral Large 3 EAGLE head (DeepSeek MLA layers, native names)
    assert {e.family for e in entries.values()} <= SIX_FAMILIES | {"mistral_large3"}
    assert {e.format for e in entries.values()} <= set(FORMATS)
    for e in entries.values():
        if e.method == "eagle":  # EAGLE-1 heads draft over the full target vocabulary
            assert e.draft_vocab_size is None, e.id
        if e.acceptance_length is not None:
            assert "source" in e.acceptance_setting, e.id


# -- plugins contribute entries through the same hook --------------------------
class ToyCatalogPlugin:
    def __init__(self, yaml_path):
        self.yaml_path = yaml_path

    @hookimpl
    def register_catalog(self, register):
        register(dict(GOOD, notes="from a dict"))
        for entry in load_catalog_file(self.yaml_path):  # a plugin's own yaml
            register(entry)


def test_plugin_adds_entries_attributed_to_it(tmp_path, register_plugin):
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({"entries": [dict(GOOD, id="acme/EAGLE-Toy-1B", method="eagle")]}))
    host = catalog_host()
    builtin_count = len(host.registry.catalog)
    name = register_plugin(ToyCatalogPlugin(path), name="toy", host=host)
    reg = host.registry
    assert len(reg.catalog) == builtin_count + 2
    assert reg.catalog["acme/EAGLE3-Toy-1B"].source == name == "toy"
    assert reg.catalog["acme/EAGLE-Toy-1B"].source == "toy"  # not the yaml path
    assert reg.catalog["yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"].source == "eagle_zoo.catalog"
    assert reg.plugins["toy"].registered["catalog"] == ["acme/EAGLE3-Toy-1B", "acme/EAGLE-Toy-1B"]


def test_plugin_entry_errors_name_plugin_and_duplicates_name_both(register_plugin):
    class Bad:
        @hookimpl
        def register_catalog(self, register):
            register(dict(GOOD, method="medusa"))

    class Clash:
        @hookimpl
        def register_catalog(self, register):
            register(dict(GOOD, id="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))

    host = catalog_host()
    register_plugin(Bad(), name="bad", host=host)
    with pytest.raises(CatalogError, match=r"plugin 'bad'.*'method'"):
        host.registry
    host.unregister("bad")
    register_plugin(Clash(), name="clash", host=host)
    with pytest.raises(PluginError, match=r"registered by two plugins: .*'(eagle_zoo\.catalog|clash)'.*"
                                          r"'(clash|eagle_zoo\.catalog)'"):
        host.registry


# -- eagle-zoo list / info -----------------------------------------------------
@pytest.fixture
def cli_host(monkeypatch):
    host = catalog_host()
    monkeypatch.setattr(catalog_cli, "get_registry", lambda: host.registry)
    return host


def test_list_filters(cli_host, capsys):
    assert cli.main(["list", "--family", "qwen3", "--method", "eagle3", "--target", "qwen3-8b"]) == 0
    out = capsys.readouterr().out
    assert "RedHatAI/Qwen3-8B-speculator.eagle3" in out and "AngelSlim/Qwen3-8B_eagle3" in out
    assert "Qwen3-32B" not in out and "LLaMA" not in out
    assert out.splitlines()[0].split() == ["ID", "METHOD", "FAMILY", "TARGET", "FORMAT", "ACCEPT", "SPEEDUP"]


def test_info_shows_every_field(cli_host, capsys):
    assert cli.main(["info", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]) == 0
    out = capsys.readouterr().out
    for text in ("draft_vocab_size        32000", "acceptance_length       2.811", "MT-bench 80 prompts",
                 "source                  eagle_zoo.catalog"):
        assert text in out


def test_info_unknown_id_suggests_close_ids(cli_host, capsys):
    assert cli.main(["info", "yuhuili/EAGLE3-LLaMA3.1-8B"]) == 2
    err = capsys.readouterr().err
    assert "unknown catalog id 'yuhuili/EAGLE3-LLaMA3.1-8B'" in err
    assert "Did you mean: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in err


def test_list_and_info_show_measured_records(monkeypatch, register_plugin, tmp_path, capsys):
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({"entries": [dict(GOOD, id="acme/EAGLE-Toy-1B", method="eagle",
                                                     measured=[RECORD, dict(RECORD, batch=8, speedup=1.2)])]}))
    host = catalog_host()
    register_plugin(ToyCatalogPlugin(path), name="toy", host=host)
    monkeypatch.setattr(catalog_cli, "get_registry", lambda: host.registry)
    assert cli.main(["list", "--target", "toy"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    assert rows["acme/EAGLE-Toy-1B"][-2:] == ["2.85", "1.90x"]  # the first record is the headline
    assert rows["acme/EAGLE3-Toy-1B"][-2:] == ["-", "-"]
    assert cli.main(["info", "acme/EAGLE-Toy-1B"]) == 0
    out = capsys.readouterr().out
    assert "measured                dev 300 prompts, cuda bfloat16, batch 1, k=3" in out
    assert "batch 8, k=3, 256 tokens, greedy: acceptance 2.850, speed-up 1.20x" in out
