"""Frozen parameters and LoRA: adapter counts against peft's own, closed forms and invariants
drawn over every program, refusals naming the field."""
import json

import pytest
from hypothesis import given, strategies as st

from memcalc import LoRA
from memcalc.engine.simulation import build_graph
from memcalc.queries.peaks import estimate_peak
from memcalc.core.errors import MemcalcError, NotModelledError, SpecError
from memcalc.refusals.finetune import lora_layout
from memcalc.engine.regime import Regime
from memcalc.inputs.specs import ModelSpec
from memcalc.inputs.training import TrainingConfig

from tests.strategies import CHECKPOINTING, cases

HF = [("gpt2", "hf"), ("llama", "hf")]


def _lora_modelled(case) -> bool:
    """Frozen parameters and LoRA are modelled for the gpt2 and llama families without sliding
    windows (memcalc.refusals.finetune refuses the rest by name)."""
    model, _ = case
    return model.family in ("gpt2", "llama") and model.sliding_window is None
TARGETS = {"llama": [["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"], ["down_proj"], "all-linear"],
           "gpt2": [["c_attn"], ["c_attn", "c_proj"], ["c_fc"], "all-linear"]}


def _elements(model: ModelSpec, training: TrainingConfig, trainable: bool) -> int:
    graph = build_graph(model, Regime.of(training))
    params = graph.trainable_params if trainable else graph.params
    return sum(v.size.eval(1, 1) // v.elt for v in params)


def _tc(**fields) -> TrainingConfig:
    return TrainingConfig(micro_batch=2, seq_len=16, device="cpu", **fields)


def _closed_form_adapters(model: ModelSpec, lora: LoRA) -> int:
    """r * (in + out) per targeted linear (lora_A: in -> r, lora_B: r -> out)."""
    h, f, a, kv, d = model.hidden_size, model.ffn_size, model.num_heads, model.kv_heads, model.head_size
    shapes = {"self_attn.q_proj": (h, a * d), "self_attn.k_proj": (h, kv * d), "self_attn.v_proj": (h, kv * d),
              "self_attn.o_proj": (a * d, h), "mlp.gate_proj": (h, f), "mlp.up_proj": (h, f),
              "mlp.down_proj": (f, h), "attn.c_attn": (h, 3 * a * d), "attn.c_proj": (a * d, h),
              "mlp.c_fc": (h, f), "mlp.c_proj": (f, h)}
    total = 0
    for name in lora_layout(model).linears:
        if lora.targets == "all-linear" or name.rsplit(".", 1)[1] in lora.targets:
            n_in, n_out = shapes[name]
            total += lora.rank * (n_in + n_out)
    return total * model.num_layers


@given(cases(programs=HF), st.integers(0, 3), st.sampled_from([1, 4, 16]))
def test_adapter_parameters_match_the_closed_form(case, which, rank):
    model, t = case
    lora = LoRA(rank=rank, targets=TARGETS[model.family][which])
    assert _elements(model, t.with_(lora=lora), True) == _closed_form_adapters(model, lora)
    # the base model is all there, frozen; adapters are fp32 under every precision
    assert _elements(model, t.with_(lora=lora), False) == model.param_count + _closed_form_adapters(model, lora)
    adapters = [v for v in build_graph(model, Regime.of(t.with_(lora=lora))).params if ".lora_" in v.label]
    assert {v.elt for v in adapters} == {4}


@given(cases(checkpointing=[c for c in CHECKPOINTING if c != "per-layer"]).filter(_lora_modelled))
def test_freezing_never_raises_the_peak(case):
    """Frozen parameters lose their gradients, optimizer states and the inputs saved for their
    weight gradients; nothing is added (per-layer checkpointing's input-grad hook is apart)."""
    model, t = case
    embed = build_graph(model, Regime.of(t)).params[0].label  # first registered: the embedding
    frozen = t.with_(freeze=(embed, "*.0.*"))
    assert estimate_peak(model, frozen) <= estimate_peak(model, t)


@given(cases(programs=HF).filter(_lora_modelled), st.sampled_from([1, 2, 8]), st.integers(1, 8))
def test_lora_peak_grows_with_rank_and_dropout(case, rank, extra):
    model, t = case
    lora = LoRA(rank=rank, targets=TARGETS[model.family][0])
    base = estimate_peak(model, t.with_(lora=lora))
    assert estimate_peak(model, t.with_(lora=lora.model_copy(update={"rank": rank + extra}))) >= base
    assert estimate_peak(model, t.with_(lora=lora.model_copy(update={"dropout": 0.1}))) >= base


@given(cases(programs=HF).filter(_lora_modelled))
def test_lora_never_costs_more_than_training_everything_plus_its_activations(case):
    """LoRA on every linear frees the base's gradients and optimizer states; what it adds is at
    most its own activations: per targeted linear the fp32 input copy, its dropout copy and
    mask, the casts, the A output and the B output twice (scaling, sum): bounded here by 8
    input-sized fp32 tensors per linear, plus the adapters' weights, grads and states."""
    model, t = case
    lora = LoRA(rank=4, dropout=0.1, targets="all-linear")
    n = t.micro_batch * t.seq_len
    widest = max(model.hidden_size, model.ffn_size, 3 * model.hidden_size)
    linears = len(lora_layout(model).linears) * model.num_layers
    adapters = _closed_form_adapters(model, lora)
    bound = linears * 8 * n * widest * 4 + 4 * adapters * 4
    assert estimate_peak(model, t.with_(lora=lora)) <= estimate_peak(model, t) + bound


def test_lora_cuts_a_7b_fine_tune_to_its_frozen_weights():
    """Llama-2-7B, bf16 autocast: LoRA r8 on q/v, the set-up whose print_trainable_parameters()
    line peft users quote ("trainable params: 4,194,304 || all params: 6,742,609,920"); the
    peak is a little above the fp32 weights."""
    model = ModelSpec.preset("llama-2-7b")
    t = TrainingConfig(micro_batch=1, seq_len=512, precision="bf16-amp", checkpointing="per-layer")
    lora = LoRA(rank=8, alpha=16, dropout=0.05, targets=["q_proj", "v_proj"])
    assert _elements(model, t.with_(lora=lora), True) == 4_194_304
    assert _elements(model, t.with_(lora=lora), False) == 6_742_609_920
    peak = estimate_peak(model, t.with_(lora=lora))
    assert 4 * model.param_count < peak < 4 * model.param_count * 1.1
    assert peak < estimate_peak(model, t) / 3


# ---- peft itself -------------------------------------------------------------------------------
PEFT_CASES = [
    ("llama", dict(rank=8, targets=["q_proj", "v_proj"])),
    ("llama", dict(rank=4, targets="all-linear", lora_bias=True)),
    ("llama", dict(rank=16, targets=["q_proj", "lm_head"], layers=[1])),
    ("qwen2", dict(rank=8, targets=["q_proj", "k_proj"], bias="all")),
    ("qwen2", dict(rank=2, targets=["v_proj", "down_proj"], bias="lora_only")),
    ("gpt2", dict(rank=8, targets=["c_attn", "c_proj"])),
    ("gpt2", dict(rank=4, targets="all-linear", bias="all")),
    ("llama", dict(rank=8, targets=["q_proj"], modules_to_save=["lm_head", "embed_tokens"])),
    ("gpt2", dict(rank=8, targets=["c_fc"], modules_to_save=["wpe", "ln_f"])),
]


@pytest.mark.parametrize("kind,fields", PEFT_CASES)
def test_trainable_parameters_match_peft(kind, fields):
    """memcalc's trainable and total parameter counts equal peft's get_nb_trainable_parameters()
    on the same model wrapped the way a user wraps it (validate.models.finetune)."""
    pytest.importorskip("peft")
    import torch  # noqa: F401

    from validate.models.finetune import apply_finetuning
    from validate.models.hf import build_hf

    model = _small(kind)
    t = _tc(lora=LoRA(**fields))
    peft_model = apply_finetuning(build_hf(model, t)[0], t)
    trainable, total = peft_model.get_nb_trainable_parameters()
    assert _elements(model, t, True) == trainable
    assert _elements(model, t, False) == total  # tied weights counted once, as parameters() does


def _small(kind: str) -> ModelSpec:
    if kind == "gpt2":
        return ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=32, num_layers=2, num_heads=2,
                              max_position_embeddings=64)
    return ModelSpec.make(name=f"{kind}-like", family="llama", vocab_size=64, hidden_size=32, num_layers=2,
                          num_heads=4, num_kv_heads=2, intermediate_size=48, max_position_embeddings=64,
                          tie_embeddings=False, qkv_bias=kind == "qwen2", out_bias=False, mlp_bias=False,
                          activation="silu")


# ---- adapter_config.json -----------------------------------------------------------------------
def test_from_peft_config_reads_what_peft_writes(tmp_path):
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                          task_type="CAUSAL_LM", use_rslora=True, modules_to_save=["lm_head"])
    cfg.save_pretrained(tmp_path)
    lora = LoRA.from_peft_config(tmp_path)
    assert (lora.rank, lora.alpha, lora.dropout, lora.targets, lora.use_rslora, lora.modules_to_save) == (
        16, 32, 0.05, ("q_proj", "v_proj"), True, ("lm_head",))
    assert LoRA.from_peft_config(json.loads((tmp_path / "adapter_config.json").read_text())) == lora


@pytest.mark.parametrize("key,value", [("use_dora", True), ("exclude_modules", ["lm_head"]),
                                       ("rank_pattern", {"q_proj": 4}), ("layer_replication", [[0, 1]]),
                                       ("no_such_key", 1)])
def test_from_peft_config_refuses_by_name(key, value):
    with pytest.raises(NotModelledError, match=f"adapter_config.{key}"):
        LoRA.from_peft_config({"r": 8, "target_modules": ["q_proj"], key: value})


# ---- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fields,name", [
    (dict(lora=LoRA(targets=["query"])), "lora.targets"),
    (dict(lora=LoRA(targets=["embed_tokens"])), "lora.targets"),
    (dict(lora=LoRA(layers=[9])), "lora.layers"),
    (dict(lora=LoRA(modules_to_save=["no_such_module"])), "lora.modules_to_save"),
    (dict(lora=LoRA(targets=["q_proj"], modules_to_save=["q_proj"])), "lora.modules_to_save"),
    (dict(freeze=("nothing.*",)), "freeze"),
    (dict(freeze=("*",)), "freeze"),
    (dict(quantization="nf4"), "quantization"),
    (dict(lora=LoRA(), world_size=2, sharding="zero1"), "sharding"),
    (dict(lora=LoRA(), quantization="nf4", world_size=2), "quantization"),
])
def test_bad_fine_tuning_input_names_the_field(fields, name):
    model = _small("llama")
    with pytest.raises(MemcalcError) as err:
        estimate_peak(model, _tc(**fields))
    assert err.value.field == name


def test_lora_fields_are_checked():
    with pytest.raises(SpecError, match="rank"):
        LoRA(rank=0)
    with pytest.raises(SpecError, match="dropout"):
        LoRA(dropout=1.5)
    with pytest.raises(SpecError, match="targets"):
        LoRA(targets=[])


def test_cli_lora_flags(capsys):
    from memcalc.cli import main

    args = ["estimate", "--model", "llama-2-7b", "--seq-len", "512", "--precision", "bf16-amp", "--json"]
    assert main(args + ["--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout", "0.05",
                        "--lora-targets", "q_proj,v_proj"]) == 0
    lora = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out)
    assert lora["peak_bytes"] < full["peak_bytes"] / 3
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--lora-rank", "16", "--lora-targets", "query"])
    assert exit_.value.code == 2
    assert "lora.targets" in capsys.readouterr().err


def test_plan_finds_lora_plans_where_full_fine_tuning_has_none():
    """A 7B full fine-tune's states alone exceed a 24 GB card; its LoRA fine-tune fits."""
    from memcalc.queries.planner import plan

    model = ModelSpec.preset("llama-2-7b")
    t = TrainingConfig(micro_batch=1, seq_len=1024, lora=LoRA(rank=16, targets=["q_proj", "v_proj"]))
    assert plan(model, "RTX-4090", 4, 1024, training=t.with_(lora=None), precisions=["bf16"],
                checkpointing=["per-layer"]) == []
    best = plan(model, "RTX-4090", 4, 1024, training=t, precisions=["bf16"], checkpointing=["per-layer"])
    assert best and best[0].micro_batch == 4


def test_modules_to_save_keeps_the_original_and_trains_a_copy():
    """peft's ModulesToSaveWrapper: the frozen original plus a trainable copy of lm_head."""
    model = _small("llama")
    lora = LoRA(rank=4, targets=["q_proj"], modules_to_save=["lm_head"])
    head = model.vocab_size * model.hidden_size
    assert _elements(model, _tc(lora=lora), False) == model.param_count + head + _closed_form_adapters(model, lora)
    assert _elements(model, _tc(lora=lora), True) == head + _closed_form_adapters(model, lora)
    tied = ModelSpec.preset("gpt2").with_(num_layers=1)
    with pytest.raises(NotModelledError, match="lora.modules_to_save"):
        estimate_peak(tied, _tc(lora=LoRA(targets=["c_attn"], modules_to_save=["lm_head"])))


# ---- QLoRA -------------------------------------------------------------------------------------
@pytest.mark.parametrize("quantization", ["nf4", "nf4-double", "fp4"])
@pytest.mark.parametrize("shape", [(512, 256), (96, 176)])
def test_quant_state_bytes_match_bitsandbytes(quantization, shape):
    """The QuantState tensors bitsandbytes makes for one weight, against memcalc's sizes."""
    bnb = pytest.importorskip("bitsandbytes")
    import torch

    from memcalc.tape.ops import quant_stat_bytes

    double = quantization == "nf4-double"
    w = bnb.nn.Params4bit(torch.randn(*shape), requires_grad=False, compress_statistics=double,
                          quant_type="fp4" if quantization == "fp4" else "nf4").to("cpu")
    qs = w.quant_state
    tensors = [qs.absmax, qs.code] + ([qs.state2.absmax, qs.state2.code, qs.offset] if double else [])
    assert [t.untyped_storage().nbytes() for t in tensors] == quant_stat_bytes(shape[0] * shape[1], double)
    assert w.untyped_storage().nbytes() == -(-shape[0] * shape[1] // 2)


@given(cases(programs=[("llama", "hf")]), st.sampled_from(["nf4", "nf4-double", "fp4"]))
def test_qlora_packs_every_linear_in_half_a_byte(case, quantization):
    model, t = case
    model = model.with_(qkv_bias=False, out_bias=False, mlp_bias=False)
    t = t.with_(quantization=quantization, lora=LoRA(rank=4, targets=["q_proj"]))
    graph = build_graph(model, Regime.of(t))
    packed = sum(v.size.eval(1, 1) for v in graph.params if v.storage.category == "quantized_weights")
    linears = sum(v.quant for v in graph.params)
    h, f, a, kv, d = model.hidden_size, model.ffn_size, model.num_heads, model.kv_heads, model.head_size
    assert linears == model.num_layers * (h * a * d * 2 + h * kv * d * 2 + 3 * h * f)
    assert packed == sum(-(-v.quant // 2) for v in graph.params if v.quant)
    # every other parameter is fp32 after prepare_model_for_kbit_training
    assert {v.elt for v in graph.params if not v.quant} == {4}


def test_qlora_7b_fits_where_lora_does_not():
    """Llama-2-7B, nf4 double quantisation, r16 q/v, bf16 compute, per-layer checkpointing:
    about 3.9 GB of packed weights and statistics, far under LoRA on bf16 weights."""
    from memcalc.queries.estimate import estimate

    model = ModelSpec.preset("llama-2-7b")
    t = TrainingConfig(micro_batch=1, seq_len=2048, precision="bf16", checkpointing="per-layer",
                       lora=LoRA(rank=16, alpha=32, targets=["q_proj", "v_proj"]))
    qlora = estimate(model, t.with_(quantization="nf4-double"))
    c = qlora.components
    assert 3.2e9 < c["quantized_weights"] + c["quantization_stats"] < 3.5e9  # 6.48e9 linear params / 2
    assert qlora.peak_bytes < estimate(model, t).peak_bytes / 2


@pytest.mark.parametrize("fields,name", [
    (dict(quantization="int8"), "quantization"),
])
def test_qlora_refusals_name_the_field(fields, name):
    with pytest.raises(NotModelledError) as err:
        estimate_peak(_small("llama"), _tc(lora=LoRA(targets=["q_proj"]), **fields))
    assert err.value.field == name
    with pytest.raises(NotModelledError, match="biases"):
        estimate_peak(_small("qwen2"), _tc(lora=LoRA(targets=["q_proj"]), quantization="nf4"))
    with pytest.raises(NotModelledError, match="llama-family"):
        estimate_peak(_small("gpt2"), _tc(lora=LoRA(targets=["c_attn"]), quantization="nf4"))


def test_qlora_with_an_odd_in_features_on_cpu_is_refused():
    """bitsandbytes' CPU dequantize_4bit falls back to a compiled Python kernel for an odd last
    dimension (measured -15.9% with intermediate_size 1279); even sizes and CUDA still answer."""
    model = _small("llama").with_(intermediate_size=175)
    t = _tc(lora=LoRA(targets=["q_proj"]), quantization="nf4").with_(device="cpu")
    with pytest.raises(NotModelledError, match="odd in_features"):
        estimate_peak(model, t)
    assert estimate_peak(model, t.with_(device="cuda")) > 0
    assert estimate_peak(model.with_(intermediate_size=176), t) > 0


def test_lora_on_an_unmeasured_family_is_refused():
    phi3 = [name for name in __import__("memcalc.inputs.presets", fromlist=["PRESETS"]).PRESETS
            if ModelSpec.preset(name).family not in ("gpt2", "llama")]
    if not phi3:
        pytest.skip("no preset of another family")
    with pytest.raises(NotModelledError) as err:
        estimate_peak(ModelSpec.preset(phi3[0]), _tc(lora=LoRA(targets="all-linear")))
    assert err.value.field == "lora"


def test_what_peft_refuses_is_refused():
    """peft 0.21 LoraConfig: layers_to_transform with a str target_modules raises; a str
    target_modules is a regex full-matched against each full module name ('q_proj' matches no
    'model.layers.0.self_attn.q_proj'), not a suffix (found by scripts/fresh_sweep.py: memcalc
    gave a number for a LoRA step peft refused)."""
    import pytest

    from memcalc.core.errors import MemcalcError
    from memcalc.inputs.lora import LoRA

    with pytest.raises(MemcalcError, match="lora.layers"):
        LoRA(targets="all-linear", layers=[0])
    with pytest.raises(MemcalcError, match="target_modules"):
        LoRA.from_peft_config({"r": 8, "target_modules": "q_proj"})
    assert LoRA(targets=["q_proj"], layers=[0]).layers == (0,)
