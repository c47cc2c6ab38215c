"""Models by hub id (issue 28, item 2): ModelSpec.from_pretrained and `--model org/name`, read offline
from a Hugging Face cache the test builds out of published config files (tests/data/hub/SOURCES.md)."""
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
from huggingface_hub import constants  # noqa: E402

from memcalc import LoRA, ModelSpec, SpecError  # noqa: E402
from memcalc.cli import main  # noqa: E402
from memcalc.inputs.hf.hub import pretrained_config  # noqa: E402

DATA = Path(__file__).parent / "data" / "hub"
COMMIT = "0" * 40


def _add(cache: Path, repo: str, files: dict[str, Path | dict]) -> None:
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snap = root / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name, src in files.items():
        if isinstance(src, dict):
            (snap / name).write_text(json.dumps(src))
        else:
            shutil.copy(src, snap / name)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    for folder in DATA.iterdir():
        if folder.is_dir():
            _add(cache, folder.name.replace("--", "/", 1), {f.name: f for f in folder.iterdir()})
    adapter = json.loads((DATA / "AliAbdien--llama-2-7b-lora" / "adapter_config.json").read_text())
    _add(cache, "test/llama-2-7b-lora-on-meta",  # the one key changed: SOURCES.md
         {"adapter_config.json": {**adapter, "base_model_name_or_path": "meta-llama/Llama-2-7b-hf"}})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


# parameter counts on the model cards (as tests/test_hf_keys.py PUBLISHED)
@pytest.mark.parametrize("repo, published", [("openai-community/gpt2", 124_439_808),
                                             ("meta-llama/Llama-2-7b-hf", 6_738_415_616),
                                             ("Qwen/Qwen2-0.5B", 494_032_768),
                                             ("mistralai/Mistral-7B-v0.3", 7_248_023_552)])
@pytest.mark.usefixtures("offline_cache")
def test_from_pretrained_reads_the_cached_config(repo, published):
    spec = ModelSpec.from_pretrained(repo)
    assert spec.name == repo
    local = ModelSpec.from_hf_config(DATA / repo.replace("/", "--", 1) / "config.json")
    assert spec == local.with_(name=repo)
    assert spec.param_count == published


@pytest.mark.usefixtures("offline_cache")
def test_peft_repo_gives_base_spec_and_adapter():
    config, lora = pretrained_config("test/llama-2-7b-lora-on-meta")
    assert ModelSpec.from_hf_config(config).with_(name="x") == \
        ModelSpec.from_pretrained("meta-llama/Llama-2-7b-hf").with_(name="x")
    assert lora == LoRA(rank=64, alpha=16, dropout=0.1, targets=["q_proj", "v_proj"])


@pytest.mark.usefixtures("offline_cache")
def test_offline_and_missing_says_so_in_one_line():
    with pytest.raises(SpecError) as err:
        ModelSpec.from_pretrained("meta-llama/Llama-3.1-8B")
    assert "not in the local Hugging Face cache" in str(err.value) and "HF_HUB_OFFLINE" in str(err.value)
    with pytest.raises(SpecError, match="genaitraining/llama-2-7b-domain-tuned: config.json is not in the local"):
        pretrained_config("AliAbdien/llama-2-7b-lora")  # the published adapter's base is not cached


@pytest.mark.usefixtures("offline_cache")
def test_cli_model_by_hub_id(capsys):
    assert main(["estimate", "--model", "Qwen/Qwen2-0.5B", "--seq-len", "128", "--json"]) == 0
    by_id = json.loads(capsys.readouterr().out)
    main(["estimate", "--model", "qwen2-0.5b", "--seq-len", "128", "--json"])
    by_preset = json.loads(capsys.readouterr().out)
    assert by_id["params"] == by_preset["params"] and by_id["model"] == "Qwen/Qwen2-0.5B"
    main(["estimate", "--model", "test/llama-2-7b-lora-on-meta", "--seq-len", "128", "--json"])
    with_adapter = json.loads(capsys.readouterr().out)
    main(["estimate", "--model", "meta-llama/Llama-2-7b-hf", "--seq-len", "128", "--lora-rank", "64",
          "--lora-alpha", "16", "--lora-dropout", "0.1", "--json"])
    assert with_adapter["peak_bytes"] == json.loads(capsys.readouterr().out)["peak_bytes"]


@pytest.mark.usefixtures("offline_cache")
def test_cli_offline_missing_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "128"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "HF_HUB_OFFLINE" in err
