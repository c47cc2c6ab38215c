"""The command's model and training flags are the input models' fields (memcalc.cli.flags): every
field a flag can give has one, with the field's docstring as help, and the command accepts and
refuses what the Python API does (the MoE options on a dense model: the command refuses them when
given, estimate() when set to other than their defaults: memcalc.refusals.step.check_moe_options)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memcalc.cli import main
from memcalc.cli.flags import field_doc, flag_fields
from memcalc.cli.main import build_parser
from memcalc.core.errors import MemcalcError, SpecError
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig
from memcalc.queries.estimate import estimate


def _dests(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {a.dest for a in sub.choices[command]._actions}


@pytest.mark.parametrize("command", ["estimate", "capacity"])
def test_every_field_a_flag_can_give_is_a_flag(command):
    """TrainingConfig's fields but lora (its --lora-* flags), ModelSpec's but name and family
    (the preset or config gives them), each with help from its docstring."""
    dests = _dests(command)
    assert set(flag_fields(TrainingConfig, skip=("lora",))) <= dests
    assert set(flag_fields(ModelSpec, skip=("name", "family"))) <= dests
    assert {"lora_rank", "lora_config", "model", "hf_config"} <= dests
    for model, names in ((TrainingConfig, flag_fields(TrainingConfig)), (ModelSpec, flag_fields(ModelSpec))):
        assert all(field_doc(model, n) for n in names), [n for n in names if not field_doc(model, n)]


@pytest.mark.parametrize("field,value", [("experts_implementation", "eager"), ("moe_routing", "balanced")])
def test_moe_options_on_a_dense_model(field, value, capsys):
    """A dense model has no experts: the command refuses the flags by name and estimate() the
    fields set to other than their defaults, with the one refusal of memcalc.refusals.step
    (check_moe_options); on a MoE model they are what they say."""
    gpt2, training = ModelSpec.preset("gpt2"), TrainingConfig(micro_batch=1, seq_len=8, **{field: value})
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--model", "gpt2", "--" + field.replace("_", "-"), value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"memcalc: error: {field}: gpt2 has no mixture-of-experts layers")
    with pytest.raises(SpecError, match=f"^{field}: gpt2 has no mixture-of-experts layers"):
        estimate(gpt2, training)
    small = ModelSpec.preset("mixtral-8x7b").with_(num_layers=1)
    assert estimate(small, training).peak_bytes > 0


_TEXT = st.sampled_from(["none", "eager", "sdpa", "cpu", "cuda", "fp32", "bf16", "zero3", "per-layer", "sqrt",
                         "padded", "ones", "worst", "balanced", "grouped_mm", "separate", "fused", "nf4", "x"])
_CHOSEN = st.sampled_from([f for f in flag_fields(TrainingConfig, skip=("lora", "freeze"))
                           if f not in ("micro_batch", "seq_len")])


@settings(max_examples=60, deadline=None)
@given(_CHOSEN, st.one_of(_TEXT, st.integers(-1, 3).map(str), st.just("0.5")))
def test_the_command_refuses_what_python_refuses(field, text):
    """One training field set from the command line: the command answers (exit 0) exactly when
    TrainingConfig and estimate() accept the value the flag parses to, else exits 2."""
    annotation = TrainingConfig.model_fields[field].annotation
    switch = annotation is bool
    argv = ["estimate", "--model", "mixtral-8x7b", "--num-layers", "1", "--micro-batch", "1", "--seq-len", "8",
            "--json"]
    argv += ["--" + field.replace("_", "-")] + ([] if switch else [text])
    value: object = True if switch else text
    for kind in (int, float):
        if not switch and (annotation is kind or str(annotation) in (f"{kind.__name__} | None",)):
            try:
                value = kind(text)
            except ValueError:
                value = None  # argparse refuses it
    python_ok = value is not None
    if python_ok:
        fields = {field: value}
        if field == "tensor_parallel":
            fields["world_size"] = value  # the command's default (--world-size defaults to it)
        try:
            estimate(ModelSpec.preset("mixtral-8x7b").with_(num_layers=1),
                     TrainingConfig.make(micro_batch=1, seq_len=8, **fields))
        except MemcalcError:
            python_ok = False
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert (code == 0) == python_ok, (field, text, code)
