"""hub.resolve against a Hugging Face cache laid out as huggingface_hub lays it out,
always offline (HF_HUB_OFFLINE=1): nothing here may touch the network."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

import checkpoint_factory as cf
import eagle_zoo
from eagle_zoo import envs, hub
from eagle_zoo.hookspecs import hookimpl
from eagle_zoo.hub import HubError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def add_to_cache(cache: Path, repo_id: str, source: Path, commit: str = COMMIT, ref: str | None = "main") -> Path:
    """Put the files of ``source`` into ``cache`` as huggingface_hub stores a download:
    models--org--name/blobs/<hash>, snapshots/<commit>/<file> (a relative symlink to the
    blob), refs/<ref> holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(source.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def eagle3_head(tmp_path):
    return cf.write_yuhuili_eagle3(tmp_path / "src", kind="safetensors", embed=True)


def test_cached_snapshot_resolves_offline(hf_home, eagle3_head):
    snapshot = add_to_cache(hf_home / "hub", "org/head", eagle3_head.path)
    assert hub.resolve("org/head") == snapshot
    assert hub.resolve("org/head", revision=COMMIT) == snapshot


def test_hf_hub_cache_wins_over_hf_home(hf_home, tmp_path, monkeypatch, eagle3_head):
    other = tmp_path / "elsewhere"
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    snapshot = add_to_cache(other, "org/head", eagle3_head.path)
    assert hub.resolve("org/head") == snapshot


def test_load_works_offline_from_the_cache(hf_home, eagle3_head):
    add_to_cache(hf_home / "hub", "org/head", eagle3_head.path)
    loaded = eagle_zoo.load("org/head")  # has its own embeddings and lm_head: no target needed
    assert loaded.format == "yuhuili-eagle3" and loaded.method == "eagle3"
    assert loaded.path.parent.name == "snapshots"
    assert torch.equal(loaded.head.d2t, eagle3_head.weights["d2t"])


def test_missing_repo_says_what_to_download(hf_home):
    with pytest.raises(HubError) as err:
        hub.resolve("org/not-downloaded")
    text = str(err.value)
    for needed in ("'org/not-downloaded'", "'main'", "hf download org/not-downloaded",
                   "huggingface-cli download org/not-downloaded", "HF_HUB_OFFLINE", str(hf_home / "hub")):
        assert needed in text
    assert err.value.__cause__ is None or isinstance(err.value.__cause__, HubError)


def test_missing_revision_names_it(hf_home, eagle3_head):
    add_to_cache(hf_home / "hub", "org/head", eagle3_head.path)
    with pytest.raises(HubError, match="'v2'.*hf download org/head --revision v2"):
        hub.resolve("org/head", revision="v2")


def test_paths_are_used_directly_or_refused(tmp_path, eagle3_head):
    assert hub.resolve(eagle3_head.path) == eagle3_head.path
    assert hub.resolve(str(eagle3_head.path)) == eagle3_head.path
    with pytest.raises(HubError, match="no such directory"):
        hub.resolve(tmp_path / "nope")
    with pytest.raises(HubError, match="no such directory"):
        hub.resolve("./nope/at/all")
    with pytest.raises(HubError, match="is a file"):
        hub.resolve(eagle3_head.path / "config.json")


def test_invalid_id(hf_home):
    with pytest.raises(HubError, match="neither a local directory nor a valid Hugging Face repo id"):
        hub.resolve("not a repo id!")


class PinnedCatalog:
    @hookimpl
    def register_catalog(self, register):
        register({
            "id": "org/pinned", "method": "eagle3", "family": "llama", "target": "org/target",
            "format": "yuhuili-eagle3", "revision": OTHER_COMMIT,
        })


def test_a_revision_of_a_local_directory_is_refused(tmp_path, eagle3_head):
    # A revision names a hub commit: asked of a local directory it would be silently ignored.
    with pytest.raises(HubError, match=r"revision='v2': .* is a local directory, and a revision applies to hub ids"):
        hub.resolve(str(eagle3_head.path), revision="v2")
    assert hub.resolve(str(eagle3_head.path)) == eagle3_head.path


def test_catalog_revision_is_used(hf_home, tmp_path, eagle3_head, register_plugin):
    register_plugin(PinnedCatalog(), "pinned-catalog")
    add_to_cache(hf_home / "hub", "org/pinned", eagle3_head.path, commit=COMMIT)
    other = cf.write_yuhuili_eagle(tmp_path / "other", kind="safetensors")
    pinned = add_to_cache(hf_home / "hub", "org/pinned", other.path, commit=OTHER_COMMIT, ref=None)
    assert hub.resolve("org/pinned") == pinned  # the catalog's pin, not refs/main
    assert hub.resolve("org/pinned", revision="main").name == COMMIT  # an explicit revision wins


def test_cache_dir_precedence(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert envs.hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert envs.hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert envs.hub_cache_dir() == tmp_path / "cache"


def test_download_dir_is_the_cache_an_engine_reads(hf_home, tmp_path, eagle3_head):
    """vLLM's download_dir (hub.Fetch): a cache in huggingface_hub's layout other than the
    environment's; the environment's cache does not have the repo."""
    elsewhere = tmp_path / "downloads"
    snapshot = add_to_cache(elsewhere, "org/head", eagle3_head.path)
    assert hub.resolve("org/head", fetch=hub.Fetch(download_dir=str(elsewhere))) == snapshot
    with pytest.raises(HubError, match="not in the Hugging Face cache"):
        hub.resolve("org/head")
    loaded = eagle_zoo.load("org/head", fetch=hub.Fetch(download_dir=str(elsewhere)))
    assert loaded.path == snapshot


def test_fetch_passes_its_cache_and_token_to_huggingface_hub(monkeypatch, tmp_path):
    import huggingface_hub

    seen = {}

    def snapshot_download(repo_id, **kw):
        seen.update(kw, repo_id=repo_id)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert hub.resolve("org/gated", fetch=hub.Fetch(download_dir=str(tmp_path / "d"), token="hf_x")) == tmp_path
    assert (seen["repo_id"], seen["cache_dir"], seen["token"]) == ("org/gated", str(tmp_path / "d"), "hf_x")
    hub.resolve("org/gated")
    assert seen["token"] is None and seen["cache_dir"] == str(envs.hub_cache_dir())


def test_llm_reads_its_target_from_download_dir(hf_home, tmp_path, monkeypatch):
    """LLM(download_dir=..., hf_token=...): the target comes from that cache, fetched with
    that token."""
    import huggingface_hub

    import engine_fixtures as ef

    from eagle_zoo import LLM, SamplingParams

    source = ef.write_target(tmp_path / "src", ef.kind_of("llama"))
    elsewhere = tmp_path / "downloads"
    snapshot = add_to_cache(elsewhere, "org/target", source)
    tokens, fetch = [], huggingface_hub.snapshot_download

    def snapshot_download(*args, **kw):
        tokens.append(kw.get("token"))
        return fetch(*args, **kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    llm = LLM("org/target", device="cpu", dtype="float32", max_model_len=64, download_dir=str(elsewhere),
              hf_token="hf_x")
    assert llm.model_path == snapshot and tokens == ["hf_x"]
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    with pytest.raises(HubError, match="not in the Hugging Face cache"):
        LLM("org/target", device="cpu", dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match="hf_token must be a string"):
        LLM("org/target", device="cpu", hf_token=123)
