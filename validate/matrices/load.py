"""Matrices as data: each topic's rows are a JSON file in validate/matrices/rows/, and
validate/matrices/matrices.json lists the topics each matrix joins. This module reads them and
builds the Cases; nothing else here decides what a row is.

A topic file holds `topic`, `about` (what the rows exercise and how they were chosen), optional
`models` and `hf_configs` (named values that several rows share) and `rows`. A row holds:

- `name`: the row's name, which keys its recorded results (validate/results/*.jsonl);
- `model`: ModelSpec fields (ModelSpec.make), or the name of an entry of `models`; with
  `hf_config` (a config.json dict, or the name of an entry of `hf_configs`) the spec is
  ModelSpec.from_hf_config of it, and `model` holds the fields changed after (its name);
- `training`: TrainingConfig fields, less `device` (the matrix's, or --device);
- or, for a run through transformers.Trainer, `trainer_args` (TrainingArguments fields) and
  `trainer` (seq_len, attention_mask, pad_tokens: how the synthetic batches are padded);
- or, for a model traced from its nn.Module (memcalc.traced), `traced`: `{"hf": true}` with an
  `hf_config` of a model type memcalc has no program for (ModelSpec.from_hf_config with
  fallback='trace'), or `{"factory": "pkg.mod:name", "loss": "pkg.mod:name", "inputs": VOCAB or
  "pkg.mod:name", "name": ...}` (ModelSpec.from_module); measured by validate.measure.module;
- optional `devices` (the devices the row runs on, when not every one) and `note`.

No torch here: the CLI builds cases before anything is measured.
"""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

from memcalc.core.errors import SpecError, UnknownNameError, closest_names
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from validate.run.case import Case

HERE = Path(__file__).resolve().parent
ROW_FIELDS = {"name", "model", "hf_config", "training", "trainer_args", "trainer", "devices", "note", "traced"}
MATRICES: dict[str, dict] = json.loads((HERE / "matrices.json").read_text())
"""Matrix name -> {'about', 'device' (its own), 'results' (its recorded file, if any), 'topics'}."""


@functools.cache
def read_topic(topic: str) -> dict:
    """A topic file's contents.

    >>> read_topic("trainer")["rows"][0]["name"]
    'tr00'
    """
    path = HERE / "rows" / f"{topic}.json"
    if not path.is_file():
        known = sorted(p.stem for p in (HERE / "rows").glob("*.json"))
        raise UnknownNameError("topic", f"unknown topic {topic!r}", f"use one of: {closest_names(topic, known)}")
    return json.loads(path.read_text())


def topic_cases(topic: str, device: str) -> list[Case]:
    """The Cases of one topic on `device` (rows that name other devices left out).

    >>> [c.name for c in topic_cases("trainer", "cuda")], len(topic_cases("trainer", "cpu"))
    ([], 8)
    """
    data = read_topic(topic)
    rows = [r for r in data["rows"] if device in r.get("devices", (device,))]
    return [build_case(row, data, topic, device) for row in rows]


def build_case(row: dict, data: dict, topic: str, device: str) -> Case:
    """One row of a topic file as a Case.

    >>> row = {"name": "x", "model": {"family": "gpt2", "vocab_size": 64, "hidden_size": 32,
    ...        "num_layers": 1, "num_heads": 2}, "training": {"micro_batch": 2, "seq_len": 8}}
    >>> c = build_case(row, {}, "demo", "cpu"); c.spec.num_layers, c.training.device, c.topic
    (1, 'cpu', 'demo')
    """
    unknown = sorted(set(row) - ROW_FIELDS)
    if unknown:
        raise SpecError(f"{topic}.{row.get('name')}.{unknown[0]}", "is not a row field",
                        f"use only {', '.join(sorted(ROW_FIELDS))}")
    fields = copy.deepcopy(_named(row.get("model", {}), data.get("models", {}), "models"))
    hf_config = None
    if "traced" in row:
        hf_config = (copy.deepcopy(_named(row["hf_config"], data.get("hf_configs", {}), "hf_configs"))
                     if "hf_config" in row else None)
        spec = traced_spec(row["traced"], hf_config, f"{topic}.{row['name']}")
        training = TrainingConfig.make(device=device, **row["training"])
        return Case(row["name"], spec, training, hf_config, traced=row["traced"], topic=topic)
    if "hf_config" in row:
        hf_config = copy.deepcopy(_named(row["hf_config"], data.get("hf_configs", {}), "hf_configs"))
        spec = ModelSpec.from_hf_config(hf_config)
        spec = spec.with_(**fields) if fields else spec
    else:
        spec = ModelSpec.make(**fields)
    trainer_args = copy.deepcopy(row.get("trainer_args"))
    if trainer_args is not None:
        how = row["trainer"]
        kind = how.get("kind", "hf")
        training = TrainingConfig.from_trainer_args(trainer_args, seq_len=how["seq_len"], device="cpu",
                                                    attention_mask=how["attention_mask"],
                                                    pad_tokens=how["pad_tokens"], trainer=kind,
                                                    packed_sequences=how.get("packed_sequences"))
        if how.get("lora") is not None:  # a TRL trainer's peft_config (not a config field)
            training = training.with_(lora=how["lora"])
        trl = {"kind": kind, "prompt_len": how["prompt_len"]} if kind != "hf" else None
        if "example_len" in how:  # SFT packing: examples of this length fill the packed rows
            trl["example_len"] = how["example_len"]
        return Case(row["name"], spec, training, hf_config, trainer_args=trainer_args, trl=trl,
                    topic=topic)
    training = TrainingConfig.make(device=device, **row["training"])
    return Case(row["name"], spec, training, hf_config, topic=topic)


def traced_spec(traced: dict, hf_config: dict | None, where: str) -> ModelSpec:
    """The traced spec a row's `traced` field names (memcalc.traced; no torch imported here).

    >>> traced_spec({"hf": True}, {"model_type": "starcoder2", "vocab_size": 64}, "x").name
    'starcoder2 (traced)'
    >>> traced_spec({"factory": "m:f", "inputs": 64, "name": "lm"}, None, "x").name
    'lm'
    """
    from memcalc.traced.spec import ModuleRef

    if traced.get("hf"):
        if hf_config is None:
            raise SpecError(f"{where}.traced", "{'hf': true} traces an hf_config", "add the row's hf_config")
        spec = ModelSpec.from_hf_config(hf_config, fallback="trace")
        if getattr(spec, "trace_key", None) is None:
            raise SpecError(f"{where}.hf_config.model_type", f"{hf_config['model_type']!r} has a hand-written "
                            "program, which wins over a trace", "use a model type memcalc has no program for")
        return spec
    if "factory" not in traced or "inputs" not in traced:
        raise SpecError(f"{where}.traced", "a traced module needs 'factory' and 'inputs'",
                        "e.g. {'factory': 'tests.traced_models:llama_factory', 'inputs': 96}")
    inputs = traced["inputs"] if isinstance(traced["inputs"], int) else ModuleRef(traced["inputs"])
    loss = ModuleRef(traced["loss"]) if traced.get("loss") else None
    return ModelSpec.from_module(ModuleRef(traced["factory"]), inputs=inputs, loss=loss,
                                 name=traced.get("name", traced["factory"]))


def _named(value: dict | str, table: dict, where: str) -> dict:
    """`value`, or the entry of `table` it names."""
    if isinstance(value, str):
        if value not in table:
            raise UnknownNameError(where, f"no entry {value!r}", f"use one of: {closest_names(value, list(table))}")
        return table[value]
    return value


def get_matrix(name: str, device: str | None = None) -> list[Case]:
    """A named matrix: its topics' rows in order; `device` overrides the matrix's own.

    >>> len(get_matrix("gpu-quick")) > 5, get_matrix("dist-ci")[0].distributed
    (True, True)
    """
    if name not in MATRICES:
        raise UnknownNameError("matrix", f"unknown matrix {name!r}",
                               f"use one of: {closest_names(name, list(MATRICES))}")
    matrix = MATRICES[name]
    return [case for topic in matrix["topics"] for case in topic_cases(topic, device or matrix["device"])]
