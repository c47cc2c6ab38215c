"""ci rows for the HF call paths (TrainingConfig.use_cache, attention_mask, labels,
num_items_in_batch; memcalc.families.call_path): each path on HF GPT-2 and Llama/Qwen2, both
attention kinds, autocast and not, GQA and not, the math SDPA kernel (CPU attention dropout),
HF per-layer checkpointing (which turns the cache off) and gradient accumulation."""
from __future__ import annotations

from validate.run.case import Case


def ci_callpath_cases(device: str = "cpu") -> list[Case]:
    """About one second a row on 2 cores.

    >>> cases = ci_callpath_cases(); len(cases), cases[0].name
    (9, 'cp00')
    >>> all(c.spec.implementation == "hf" for c in cases)
    True
    """
    from validate.matrices.shapes import CI_SHAPES, _case  # the ci matrix's shapes and row builder

    base = dict(precision="fp32", checkpointing="none", optimizer="adamw", impl=None,
                attention="sdpa", grad_accum=1)
    rows = [  # (model, shape index, training overrides, call-path fields)
        ("gpt2-hf", 0, {}, dict(use_cache=True)),
        ("gpt2-hf", 1, dict(precision="bf16-amp", attention="eager"),
         dict(use_cache=True, attention_mask="padded", pad_tokens=5, labels="separate")),
        ("gpt2-hf", 2, dict(precision="fp16-amp"),
         dict(attention_mask="padded", pad_tokens=9, labels="separate", num_items_in_batch=True)),
        ("llama-hf", 0, dict(precision="bf16-amp"), dict(use_cache=True, attention_mask="ones")),
        ("llama-hf", 2, {}, dict(attention_mask="padded", pad_tokens=17, use_cache=True)),
        ("qwen2-hf", 4, dict(precision="bf16", attention="eager"),
         dict(use_cache=True, attention_mask="padded", pad_tokens=4, labels="separate",
              num_items_in_batch=True)),
        ("llama-hf", 4, dict(precision="bf16-amp", checkpointing="per-layer"),
         dict(use_cache=True, attention_mask="ones", labels="separate")),
        ("gpt2-hf", 3, dict(grad_accum=2, optimizer="sgd-momentum"),
         dict(use_cache=True, attention_mask="ones", num_items_in_batch=True)),
        ("llama-hf", 4, dict(precision="bf16-amp"),  # one kv head: repeat_kv is a view
         dict(attention_mask="padded", pad_tokens=6, labels="separate")),
    ]
    cases = []
    for i, (model, shape, training, call_path) in enumerate(rows):
        case = _case(f"cp{i:02d}", {**base, **training, "model": model}, CI_SHAPES[shape], device)
        cases.append(Case(case.name, case.spec, case.training.with_(**call_path), case.hf_config))
    return cases
