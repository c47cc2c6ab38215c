"""The environment of a validation run, as JSON, with a few allocator probes on CUDA.

    python scripts/gpu_env.py --out OUT/env.json [--device cuda|cpu] [--site DIR]

Prints one line per fact and writes them all to --out. Exit status: 0 when memcalc, validate and
the four HF causal-LM classes import; 3 when only transformers fails (gpu_run.sh then falls back to
the image's transformers); 4 when memcalc/pydantic/torch fail (nothing can be measured).

CUDA probes (facts the engine assumes but no GPU has checked yet, memcalc/queries/estimate.py and
memcalc/inputs/gpus.py): the CUDA context size (NVML used before and after the first kernel), and the
bytes the caching allocator hands cuBLAS / cuBLASLt as workspace at the first matmul of each dtype
(the engine assumes CUBLAS_WORKSPACE_BYTES = 32 MiB).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback

MIB = 2**20
HF_CLASSES = ("GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
PACKAGES = ("torch", "transformers", "pydantic", "pydantic_core", "sympy", "tqdm", "pynvml",
            "huggingface_hub", "tokenizers", "safetensors", "regex", "numpy", "typing_extensions")


def _origin(module, site: str | None) -> str:
    path = getattr(module, "__file__", "") or ""
    if site and os.path.realpath(path).startswith(os.path.realpath(site)):
        return "carried"
    return "image"


def packages(site: str | None) -> dict:
    """{name: 'version (carried|image)' or 'missing: ...'} for the packages the run uses."""
    found = {}
    for name in PACKAGES:
        try:
            mod = importlib.import_module(name)
        except Exception as err:  # report, never stop: the caller decides what is essential
            found[name] = f"missing: {type(err).__name__}: {str(err)[:120]}"
            continue
        version = getattr(mod, "__version__", None)
        if version is None:
            try:
                from importlib.metadata import version as dist_version

                version = dist_version({"pynvml": "nvidia-ml-py"}.get(name, name))
            except Exception:
                version = "?"
        found[name] = f"{version} ({_origin(mod, site)})"
    return found


def check_imports() -> dict:
    """Import what a run needs; {'memcalc': 'ok' | error, 'transformers': ..., 'validate': ...}."""
    result = {}
    try:
        import memcalc

        report = memcalc.estimate(memcalc.ModelSpec.preset("gpt2"),
                                  memcalc.TrainingConfig(micro_batch=1, seq_len=128))
        result["memcalc"] = f"ok (gpt2 b1 s128 peak {report.peak_bytes / MIB:.1f} MiB)"
    except Exception as err:
        result["memcalc"] = f"error: {type(err).__name__}: {str(err)[:200]}"
    try:
        import transformers

        for cls in HF_CLASSES:
            getattr(transformers, cls)
        from transformers import AttentionInterface  # noqa: F401  (selective checkpointing)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: F401
        result["transformers"] = f"ok ({transformers.__version__}: {', '.join(HF_CLASSES)})"
    except Exception as err:
        result["transformers"] = f"error: {type(err).__name__}: {str(err)[:300]}"
    try:
        import validate.run.cli  # noqa: F401
        import validate.measure.backends  # noqa: F401

        result["validate"] = "ok"
    except Exception as err:
        result["validate"] = f"error: {type(err).__name__}: {str(err)[:200]}"
    return result


def torch_facts(device: str) -> dict:
    import torch

    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(),
             "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
             "float32_matmul_precision": torch.get_float32_matmul_precision()}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                     total_memory_bytes=props.total_memory,
                     multiprocessors=props.multi_processor_count,
                     cudnn=torch.backends.cudnn.version())
    return facts


def _nvml_used():
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return info.used, info.total, driver if isinstance(driver, str) else driver.decode()
    except Exception:
        return None, None, None


def cuda_probes() -> dict:
    """CUDA context size and cuBLAS/cuBLASLt workspace bytes taken from the caching allocator."""
    import torch

    probes = {}
    used0, total, driver = _nvml_used()
    probes.update(nvml_used_before_init=used0, nvml_total=total, driver=driver)
    torch.cuda.init()
    x = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    used1, _, _ = _nvml_used()
    probes["nvml_used_after_init"] = used1
    if used0 is not None and used1 is not None:
        # context = NVML delta minus what the caching allocator reserved for x (one 2 MiB block)
        probes["context_mib"] = round((used1 - used0 - torch.cuda.memory_reserved()) / MIB, 1)
    del x
    n = 2048
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        c = a @ b
        torch.cuda.synchronize()
        after_mm = torch.cuda.memory_allocated()
        d = torch.nn.functional.linear(a, b, bias)  # addmm with bias: the cuBLASLt path
        torch.cuda.synchronize()
        after_lt = torch.cuda.memory_allocated()
        name = str(dtype).replace("torch.", "")
        probes[f"matmul_workspace_{name}_mib"] = round((after_mm - before - c.nbytes) / MIB, 3)
        probes[f"addmm_extra_workspace_{name}_mib"] = round((after_lt - after_mm - d.nbytes) / MIB, 3)
        del a, b, bias, c, d
    probes["allocated_after_probes_mib"] = round(torch.cuda.memory_allocated() / MIB, 3)
    used2, _, _ = _nvml_used()
    probes["nvml_used_after_probes"] = used2
    torch.cuda.empty_cache()
    return probes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--site", help="the folder the carried wheels were installed into")
    args = parser.parse_args(argv)
    env = {"python": sys.version.split()[0], "executable": sys.executable,
           "platform": platform.platform(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
                                                  "CUDA_VISIBLE_DEVICES", "PYTHONPATH")}}
    env["packages"] = packages(args.site)
    env["imports"] = check_imports()
    try:
        env["torch_facts"] = torch_facts(args.device)
    except Exception as err:
        env["torch_facts"] = {"error": f"{type(err).__name__}: {err}"}
    if args.device == "cuda":
        try:
            env["cuda_probes"] = cuda_probes()
        except Exception as err:
            env["cuda_probes"] = {"error": f"{type(err).__name__}: {err}",
                                  "traceback": traceback.format_exc()[-1500:]}
    with open(args.out, "w") as f:
        json.dump(env, f, indent=1, sort_keys=True)
    for section in ("packages", "imports", "torch_facts", "cuda_probes"):
        for key, value in (env.get(section) or {}).items():
            if key != "traceback":
                print(f"env: {section}.{key} = {value}")
    imports = env["imports"]
    if not imports["memcalc"].startswith("ok") or not imports["validate"].startswith("ok"):
        return 4
    if not imports["transformers"].startswith("ok"):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
