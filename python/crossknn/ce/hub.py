"""A Hugging Face Hub model id (``cross-encoder/ms-marco-MiniLM-L-6-v2``) as a model folder.

Wherever crossknn takes a model folder (``--model``, ``--de-model``, ``crossknn.CrossEncoder``),
a name that is not a folder on disk but has the shape of a Hub id (``NAME`` or ``ORG/NAME``,
optionally ``@REVISION``) is looked up with ``huggingface_hub`` (a dependency of ``tokenizers``):

- with the Hub reachable: the revision (default ``main``) is resolved to its commit and the files
  a checkpoint needs (config, tokenizer, weights, sentence-transformers files; not the other
  formats a repository may carry) are downloaded into the Hugging Face cache
  (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``) once;
- offline (``HF_HUB_OFFLINE=1``, or the Hub cannot be reached): the snapshot already in that
  cache (``models--ORG--NAME/snapshots/COMMIT``, the commit read from ``refs/REVISION``);
- neither: :class:`HubModelNotFound`, one line saying how to get the model.

The snapshot is then exported to ONNX like any Hugging Face folder, once, into the crossknn cache
under a name keyed by the repository and its commit (:func:`crossknn.ce.folders.resolve_model`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HubModelNotFound", "HubSnapshot", "hub_snapshot", "looks_like_hub_id"]

# a repository name: letters, digits, "-", "_", "."; an optional owner; an optional @revision
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")
# what a checkpoint needs: small files by name, the weights by the first pattern the repo has
_FILES = [
    "*.json",
    "*.txt",
    "*.model",  # sentencepiece vocabularies
    "1_Pooling/*",
]
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class HubModelNotFound(FileNotFoundError):
    """A model id that is neither a folder nor reachable on the Hub nor in the local Hub cache."""


@dataclass(frozen=True)
class HubSnapshot:
    """A model of the Hub on disk: ``repo_id``, the ``commit`` it resolved to and its folder."""

    repo_id: str
    commit: str
    path: Path

    @property
    def key(self) -> str:
        """A file-name-safe key of the repository and commit (the export cache's name)."""
        return f"{self.repo_id.replace('/', '--')}-{self.commit[:12]}"


def looks_like_hub_id(name: str | os.PathLike) -> bool:
    """Whether ``name`` (not an existing path) has the shape of a Hub model id."""
    text = str(name)
    if os.path.exists(text) or text.startswith((".", "/", "~")) or text.count("/") > 1:
        return False
    return bool(_HUB_ID.match(text))


def _how_to_get(repo_id: str, cache: str) -> str:
    folder = "models--" + repo_id.replace("/", "--")
    return (
        f'get it where the Hub is reachable (python -c "import huggingface_hub; '
        f"huggingface_hub.snapshot_download('{repo_id}')\") and copy that cache's {folder} "
        f"folder into {cache}, or pass a local model folder"
    )


def hub_snapshot(name: str) -> HubSnapshot:
    """The local snapshot folder of the Hub model ``name`` (``ORG/NAME[@REVISION]``), downloaded
    now if the Hub is reachable and it is missing; :class:`HubModelNotFound` in one line when it
    can be neither found nor downloaded."""
    # huggingface_hub: only a model named by its Hub id needs it (imported with tokenizers)
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, _, revision = str(name).partition("@")
    revision = revision or None
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=_FILES))
        if not any((folder / w).is_file() for w in _WEIGHTS):
            for weights in _WEIGHTS:  # the first weights format the repository has
                folder = Path(
                    snapshot_download(repo_id, revision=revision, allow_patterns=[weights])
                )
                if (folder / weights).is_file():
                    break
    except (LocalEntryNotFoundError, RepositoryNotFoundError, GatedRepoError) as exc:
        if isinstance(exc, LocalEntryNotFoundError):
            # what huggingface_hub itself read at its import (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE)
            offline = bool(getattr(constants, "HF_HUB_OFFLINE", False))
            why = "the Hub is offline (HF_HUB_OFFLINE=1)" if offline else "the Hub is unreachable"
            cache = constants.HF_HUB_CACHE
            raise HubModelNotFound(
                f"model {name!r} is not a folder, and it is not in the local Hugging Face cache "
                f"({cache}) while {why}: {_how_to_get(repo_id, cache)}"
            ) from None
        raise HubModelNotFound(
            f"model {name!r} is not a folder, and the Hub has no model {repo_id!r} that can be "
            "read without a token (not found, private or gated): check the name, or log in "
            "with huggingface_hub and try again"
        ) from None
    except RevisionNotFoundError:
        raise HubModelNotFound(
            f"model {repo_id!r} has no revision {revision!r} on the Hub"
        ) from None
    except HfHubHTTPError as exc:
        raise HubModelNotFound(f"model {name!r}: the Hub answered {exc}") from None
    commit = folder.name
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"{folder}: expected a Hub snapshot folder named by its commit")
    return HubSnapshot(repo_id=repo_id, commit=commit, path=folder)
