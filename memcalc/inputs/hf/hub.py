"""Models by Hugging Face Hub id ("org/name"): config.json, and adapter_config.json for a peft
repo, read through huggingface_hub's hf_hub_download from the local cache or the Hub. Only those
JSON files are fetched, never weights. With HF_HUB_OFFLINE=1 only the cache is read, and a file
missing from it is one line naming the repo and the fix. huggingface_hub is not an engine
dependency: it is imported here, when a hub id is used.

A peft repo (adapter_config.json, no config.json) names its base model in
base_model_name_or_path; the base's config.json gives the ModelSpec and the adapter config the LoRA
(LoRA.from_peft_config: every key modelled, inert or refused by name).
"""
from __future__ import annotations

import re
from typing import Any

from memcalc.core.errors import MemcalcError, SpecError

# huggingface_hub's repo id rule (utils/_validators.py validate_repo_id): one optional namespace
REPO_ID = re.compile(r"^[\w.\-]{1,96}/[\w.\-]{1,96}$")


def is_hub_id(name: object) -> bool:
    """Whether a --model value names a hub repo ('org/name') rather than a preset.

    >>> is_hub_id("meta-llama/Llama-3.1-8B"), is_hub_id("llama-3-8b"), is_hub_id("./config.json")
    (True, False, False)
    """
    return isinstance(name, str) and bool(REPO_ID.match(name)) and not name.startswith(".")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise MemcalcError("model", "a hub id needs huggingface_hub, which is not installed",
                           "pip install huggingface_hub, or pass --hf-config PATH") from None
    return huggingface_hub


def download_json(repo_id: str, filename: str, revision: str | None = None, missing_ok: bool = False) -> dict | None:
    """One JSON file of a hub repo, from the cache or the Hub (None when missing_ok and the
    repo has no such file); every failure is one SpecError naming the repo and the fix
    (tests/test_hub.py reads an offline cache)."""
    hub = _hub()
    from huggingface_hub import constants, errors

    from memcalc.core.files import read_json_object

    offline = constants.is_offline_mode()
    try:
        path = hub.hf_hub_download(repo_id, filename, revision=revision)
    except errors.LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError: caught first)
        if missing_ok:
            return None
        raise _not_cached(repo_id, filename) if offline else SpecError(
            "model", f"{repo_id}: {filename} could not be downloaded (no connection?) and is not cached",
            "connect, or pass --hf-config PATH") from None
    except errors.EntryNotFoundError:  # the repo has no such file
        if missing_ok:
            return None
        raise SpecError("model", f"{repo_id} has no {filename}", "check the repo id") from None
    except errors.GatedRepoError:
        raise SpecError("model", f"{repo_id} is gated", "accept its licence on huggingface.co and "
                        "log in (`hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise SpecError("model", f"{repo_id} is not a repo on the Hub (or is private)",
                        "check the id, or log in") from None
    except errors.RevisionNotFoundError:
        raise SpecError("revision", f"{revision!r} is not a revision of {repo_id}",
                        "use a branch, tag or commit of the repo") from None
    except (errors.HfHubHTTPError, errors.HFValidationError, OSError) as err:
        raise SpecError("model", f"{repo_id}: {str(err).splitlines()[0][:100]}",
                        "check the id, or pass --hf-config PATH") from None
    return read_json_object(path, "hf_config" if filename == "config.json" else "adapter_config")


def _not_cached(repo_id: str, filename: str) -> SpecError:
    return SpecError("model", f"{repo_id}: {filename} is not in the local Hugging Face cache and "
                     "HF_HUB_OFFLINE=1 forbids the download", f"run once online (or `hf download {repo_id} "
                     f"{filename}`), or unset HF_HUB_OFFLINE")


def pretrained_config(repo_id: str, revision: str | None = None) -> tuple[dict, Any]:
    """(config.json as a dict, LoRA or None) of a hub repo: a model repo's config.json, or a peft
    repo's adapter_config.json with its base model's config.json (ModelSpec.from_pretrained and
    `--model org/name` build the spec).

    >>> pretrained_config("gpt2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    memcalc.core.errors.SpecError: model: 'gpt2' is not a hub id 'org/name'; fix: ...
    """
    from memcalc.inputs.lora import LoRA

    if not is_hub_id(repo_id):
        raise SpecError("model", f"{str(repo_id)[:60]!r} is not a hub id 'org/name'",
                        "e.g. meta-llama/Llama-3.1-8B, or a preset name")
    config = download_json(repo_id, "config.json", revision, missing_ok=True)
    lora = None
    if config is None:
        adapter = download_json(repo_id, "adapter_config.json", revision, missing_ok=True)
        if adapter is None and _hub().constants.is_offline_mode():
            raise _not_cached(repo_id, "config.json")
        if adapter is None:
            raise SpecError("model", f"{repo_id} has neither config.json nor adapter_config.json",
                            "check the id: memcalc reads transformers and peft repos")
        lora = LoRA.from_peft_config(adapter)
        base = adapter.get("base_model_name_or_path")
        if not is_hub_id(base):
            raise SpecError("adapter_config.base_model_name_or_path", f"{str(base)[:60]!r} is not a hub id",
                            "pass the base model with --hf-config PATH and the adapter with --lora-config")
        config = download_json(base, "config.json", adapter.get("revision"))
    return config, lora
