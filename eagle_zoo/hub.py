"""An id or a path -> a local checkpoint directory.

A local directory is used as it is. Anything else is a Hugging Face repo id (a
catalog id is one, and may pin a revision) fetched through huggingface_hub's own
cache, so a snapshot downloaded once (by us, `hf download` or transformers) is found
again offline. The environment is read at call time, not when huggingface_hub was
imported, so HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE set later still count. An engine
may name another cache directory and a token (vLLM's download_dir and hf_token: Fetch).
Every failure comes out as a HubError that says what to download and how.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import envs

# Files a head needs; nothing else in a repo is downloaded (never *.py: no remote code).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.bin"]


class HubError(RuntimeError):
    """An id could not be turned into a local directory; the message says what to do."""


@dataclass(frozen=True)
class Fetch:
    """How hub ids are fetched: ``download_dir``, a cache directory in huggingface_hub's
    layout instead of its default one (HF_HUB_CACHE / HF_HOME); ``token``, the token for
    gated or private repos instead of HF_TOKEN / the `hf auth login` one."""

    download_dir: Optional[str] = None
    token: Optional[str] = None

    def cache_dir(self) -> Path:
        return Path(self.download_dir).expanduser() if self.download_dir else envs.hub_cache_dir()


DEFAULT_FETCH = Fetch()


def _looks_like_path(text: str) -> bool:
    # Hub ids are "org/name" or "name"; these can only be meant as paths.
    return text.startswith(("/", "./", "../", "~")) or text in (".", "..") or text.count("/") > 1


def _download_hint(repo_id: str, revision: Optional[str], fetch: Fetch) -> str:
    options = (f" --revision {revision}" if revision else "") + (f" --cache-dir {fetch.download_dir}"
                                                                  if fetch.download_dir else "")
    return f"`hf download {repo_id}{options}` (or `huggingface-cli download {repo_id}{options}`)"


def _catalog_revision(repo_id: str) -> Optional[str]:
    from .plugins import get_registry

    entry = get_registry().catalog.get(repo_id)
    return getattr(entry, "revision", None) if entry is not None else None


def resolve(id_or_path, revision: Optional[str] = None, fetch: Fetch = DEFAULT_FETCH) -> Path:
    """A local directory holding the checkpoint named by ``id_or_path``."""
    text = str(id_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        _refuse_revision(revision, f"{path} is a local directory")
        return path
    if path.exists():
        raise HubError(f"{path} is a file; pass the checkpoint directory that holds config.json")
    if isinstance(id_or_path, Path) or _looks_like_path(text):
        raise HubError(f"{path}: no such directory")
    shipped = _catalog_path(text)
    if shipped is not None:
        _refuse_revision(revision, f"{text} ships inside its plugin package ({shipped})")
        return shipped
    return _snapshot(text, revision or _catalog_revision(text), fetch)


def _refuse_revision(revision: Optional[str], where: str) -> None:
    """A revision names a commit of a hub repository: asked of anything else it would be ignored."""
    if revision is not None:
        raise HubError(f"revision={revision!r}: {where}, and a revision applies to hub ids only; drop it, or "
                       f"pass the hub id")


def _catalog_path(repo_id: str) -> Optional[Path]:
    """A catalog entry whose head ships inside its plugin package resolves locally."""
    from .plugins import get_registry

    entry = get_registry().catalog.get(repo_id)
    if entry is None or entry.path is None:
        return None
    path = Path(entry.path)
    if not path.is_dir():
        raise HubError(
            f"catalog entry {repo_id!r} (from {entry.source}) ships its head at {path}, which is missing: "
            f"reinstall the plugin package that registers it"
        )
    return path


def _snapshot(repo_id: str, revision: Optional[str], fetch: Fetch) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = fetch.cache_dir()
    is_offline = envs.hub_offline()
    where = f"{repo_id!r} (revision {revision or 'main'!r})"
    hint = _download_hint(repo_id, revision, fetch)
    try:
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=str(cache),
                token=fetch.token,
                local_files_only=is_offline,
                allow_patterns=ALLOW_PATTERNS,
            )
        )
    except HFValidationError as exc:
        raise HubError(
            f"{repo_id!r} is neither a local directory nor a valid Hugging Face repo id "
            f"(org/name): {exc}"
        ) from None
    except IncompleteSnapshotError:
        raise HubError(
            f"the cached snapshot of {where} in {cache} is incomplete. Complete it with "
            f"{hint} while online."
        ) from None
    except LocalEntryNotFoundError:
        if is_offline:
            why = "HF_HUB_OFFLINE is set, so nothing may be downloaded"
            fix = f"Download it first with {hint}, or unset HF_HUB_OFFLINE"
        else:
            why = "the Hub could not be reached"
            fix = f"Check the network, or download it elsewhere with {hint} and copy the cache"
        raise HubError(f"{where} is not in the Hugging Face cache at {cache} and {why}. {fix}.") from None
    except GatedRepoError:
        raise HubError(
            f"{where} is gated: accept its terms on huggingface.co and log in (`hf auth login`), "
            f"then {hint}"
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"{repo_id!r} has no revision {revision!r}; pass an existing branch, tag or commit") from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{repo_id!r} is neither a local directory nor a Hugging Face repo that exists (or you "
            f"lack access to it); check the id or pass a path"
        ) from None
    except Exception as exc:  # the boundary: nothing from huggingface_hub leaks out bare
        raise HubError(f"could not fetch {where} into {cache}: {type(exc).__name__}: {exc}. Try {hint}.") from exc
