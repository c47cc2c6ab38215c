"""Measurement backends: run build + steps under a meter and return a Measurement.

- 'cpu': LiveTensorTracker around model construction, optimizer and all steps (one tracker, so
  every tensor ever created is counted); peaks are exact live storage bytes.
- 'fake': the same under FakeTensorMode: shapes and storages without compute, for big models.
- 'cuda': torch.cuda peak statistics: max_memory_allocated (what memcalc predicts),
  max_memory_reserved, and NVML device memory used, each reported separately; with
  validate.measure.cuda_snapshot configured, a memory snapshot with history per row.
- `memtracker_peaks`: the same run under torch.distributed._tools.mem_tracker.MemTracker, a
  second, independent implementation of live-tensor counting, for cross-checks.
"""
from __future__ import annotations

import gc
import platform
import time
from dataclasses import asdict, dataclass, field

import torch

from memcalc.core.errors import MemcalcError
from validate.measure import cuda_snapshot
from validate.measure.step import PHASES, build_trainee, optimizer_class, run_steps
from validate.measure.tracker import LiveTensorTracker

BACKENDS = ("cpu", "fake", "cuda")


@dataclass
class Measurement:
    """What one configuration measured (bytes)."""

    status: str  # 'ok' or 'oom'
    backend: str
    peak_bytes: int | None = None
    first_step_peak_bytes: int | None = None
    phases: dict[str, int] = field(default_factory=dict)
    first_step_phases: dict[str, int] = field(default_factory=dict)
    implementation: str = ""
    device: str = "cpu"
    device_name: str = ""
    torch_version: str = torch.__version__
    param_dtype: str = ""
    sdpa_backend: str | None = None
    extra: dict = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain JSON-ready dict.

        >>> Measurement(status="ok", backend="cpu").to_dict()["status"]
        'ok'
        """
        return asdict(self)


# ---- meters ------------------------------------------------------------------------------------
class TrackerMeter:
    """Meter over a LiveTensorTracker."""

    def __init__(self, tracker: LiveTensorTracker):
        self.tracker = tracker

    def reset_peak(self) -> None:
        self.tracker.reset_peak()

    def peak(self) -> int:
        return self.tracker.peak

    def mark(self, label: str) -> None:
        self.tracker.mark(label)


class CudaMeter:
    """Meter over torch.cuda's allocator statistics; also samples reserved bytes and NVML."""

    def __init__(self):
        self.reserved_peak = 0
        self.nvml_peak = 0
        self._nvml = _nvml_handle()

    def reset_peak(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        torch.cuda.synchronize()
        self.reserved_peak = max(self.reserved_peak, torch.cuda.max_memory_reserved())
        if self._nvml is not None:
            import pynvml

            self.nvml_peak = max(self.nvml_peak, pynvml.nvmlDeviceGetMemoryInfo(self._nvml).used)
        return torch.cuda.max_memory_allocated()

    def mark(self, label: str) -> None:
        pass


def _nvml_handle():
    try:
        import pynvml

        pynvml.nvmlInit()
        index = torch.cuda.current_device()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # NVML missing or not permitted: report None, measure the rest
        return None


class MemTrackerMeter:
    """Meter over torch's MemTracker. Resetting its peak uses its private `_peak_mem` (no public
    reset exists in torch 2.13)."""

    def __init__(self, mt):
        self.mt = mt

    def _current(self) -> int:
        snap = self.mt.get_tracker_snapshot("current")
        return max((d.get("Total", 0) for d in snap.values()), default=0)

    def begin_step(self) -> None:
        self.mt.reset_mod_stats()  # MemTracker refuses a second forward of a module otherwise

    def reset_peak(self) -> None:
        current = self.mt.get_tracker_snapshot("current")
        self.mt._peak_mem = {dev: d.get("Total", 0) for dev, d in current.items()}

    def peak(self) -> int:
        return max(self.mt._peak_mem.values(), default=0)

    def mark(self, label: str) -> None:
        pass


# ---- backends ----------------------------------------------------------------------------------
def measure(spec, training, backend: str = "cpu", hf_config: dict | None = None,
            steps: int = 3, seed: int = 0) -> Measurement:
    """Build and run the configuration on a backend; steady-state and first-step peaks.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> m = measure(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))
    >>> m.status, m.peak_bytes > 16 * spec.param_count
    ('ok', True)
    """
    if backend not in BACKENDS:
        raise MemcalcError("backend", f"unknown backend {backend!r}", f"use one of {BACKENDS}")
    if (backend == "cuda") != (training.device == "cuda"):
        raise MemcalcError("device", f"backend {backend!r} cannot run device={training.device!r}",
                           "use --device cuda with the cuda backend, cpu otherwise")
    # import the optimizer's library before measuring: tensors bitsandbytes and transformers
    # make at import time (module globals, 128 and 144 bytes measured) are not the step's
    optimizer_class(training.optimizer)
    start = time.perf_counter()
    if training.lora is not None:  # peft imports bitsandbytes, whose import-time tables
        import peft  # noqa: F401  # (FP4/NF4 lookup tensors) must not count as the step's
    runner = {"cpu": _measure_tracker, "fake": _measure_fake, "cuda": _measure_cuda}[backend]
    result = runner(spec, training, hf_config, steps, seed)
    result.wall_s = round(time.perf_counter() - start, 3)
    return result


def _fill(result: Measurement, trainee, run) -> Measurement:
    result.peak_bytes = run.steady.peak
    result.first_step_peak_bytes = run.first.peak
    result.phases = dict(run.steady.phases)
    result.first_step_phases = dict(run.first.phases)
    result.implementation = trainee.implementation
    result.param_dtype = str(next(trainee.model.parameters()).dtype).replace("torch.", "")
    recorder = getattr(trainee.model, "_memcalc_router_recorder", None)
    if recorder is not None:  # MoE: tokens per expert of every forward (validate.models.moe_routing)
        result.extra["routing_passes"] = recorder.passes
    return result


def _run_under(meter, spec, training, hf_config, steps, seed):
    gc.collect()
    gc.disable()  # cyclic garbage freed at a random moment would make peaks flaky
    try:
        trainee = build_trainee(spec, training, hf_config, seed)
        run = run_steps(trainee, training, meter, spec.vocab_size, steps)
    finally:
        gc.enable()
    return trainee, run


def _measure_tracker(spec, training, hf_config, steps, seed) -> Measurement:
    with LiveTensorTracker() as tracker:
        trainee, run = _run_under(TrackerMeter(tracker), spec, training, hf_config, steps, seed)
    result = Measurement(status="ok", backend="cpu", device="cpu", device_name=cpu_name(),
                         sdpa_backend=sdpa_backend(spec, training))
    result.extra["untracked_tensors"] = tracker.untracked
    return _fill(result, trainee, run)


def _measure_fake(spec, training, hf_config, steps, seed) -> Measurement:
    from torch._subclasses.fake_tensor import FakeTensorMode

    if training.precision == "fp16-amp":
        raise MemcalcError("precision", "fp16-amp cannot run under FakeTensorMode (GradScaler "
                           "reads its inf check with .item())", "use the cpu or cuda backend")
    with FakeTensorMode(), LiveTensorTracker() as tracker:
        trainee, run = _run_under(TrackerMeter(tracker), spec, training, hf_config, steps, seed)
    result = Measurement(status="ok", backend="fake", device=training.device,
                         device_name="FakeTensorMode")
    return _fill(result, trainee, run)


def _measure_cuda(spec, training, hf_config, steps, seed) -> Measurement:
    result = Measurement(status="ok", backend="cuda", device="cuda",
                         device_name=torch.cuda.get_device_name())
    result.extra["total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    gc.collect()
    torch.cuda.empty_cache()
    meter = CudaMeter()
    try:
        with cuda_snapshot.recording(spec, training, hf_config, result.extra):  # --cuda-snapshots
            trainee, run = _run_under(meter, spec, training, hf_config, steps, seed)
    except torch.cuda.OutOfMemoryError as err:
        result.status = "oom"
        result.extra["error"] = str(err).splitlines()[0][:300]
        trainee = run = None
    if run is not None:
        _fill(result, trainee, run)
        result.extra.update(max_memory_reserved=meter.reserved_peak, nvml_used_peak=meter.nvml_peak
                            or None, note="reserved/nvml peaks cover all steps, warm-up included")
    result.sdpa_backend = sdpa_backend(spec, training) if result.status == "ok" else None
    del trainee, run
    gc.collect()
    torch.cuda.empty_cache()
    return result


def memtracker_peaks(spec, training, hf_config: dict | None = None, steps: int = 3,
                     seed: int = 0) -> dict:
    """The same run under torch's MemTracker: {'peak_bytes', 'first_step_peak_bytes', 'phases'}.

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=1,
    ...                       num_heads=2, implementation="reference")
    >>> memtracker_peaks(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu"))["peak_bytes"] > 0
    True
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    with mt:
        _, run = _run_under(MemTrackerMeter(mt), spec, training, hf_config, steps, seed)
    return {"peak_bytes": run.steady.peak, "first_step_peak_bytes": run.first.peak,
            "phases": dict(run.steady.phases)}


# ---- environment facts -------------------------------------------------------------------------
def cpu_name() -> str:
    """The CPU's name as platform reports it (for result rows)."""
    return platform.processor() or platform.machine() or "cpu"


def _compute_dtype(training):
    return {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16,
            "bf16": torch.bfloat16}.get(training.precision, torch.float32)


def sdpa_backend(spec, training) -> str | None:
    """The SDPA kernel torch picks for the model's attention shapes (None for eager attention).

    >>> from memcalc.inputs.specs import ModelSpec; from memcalc.inputs.training import TrainingConfig
    >>> spec = ModelSpec.make(family="gpt2", vocab_size=64, hidden_size=16, num_layers=1, num_heads=2)
    >>> sdpa_backend(spec, TrainingConfig(micro_batch=1, seq_len=8, device="cpu", attention="sdpa"))
    'FLASH_ATTENTION'
    """
    if training.resolved_attention(spec) != "sdpa":
        return None
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        return None
    b, s, d = training.micro_batch, training.seq_len, spec.head_size
    opts = dict(dtype=_compute_dtype(training), device=training.device)
    q = torch.empty(b, spec.num_heads, s, d, **opts)
    kv = torch.empty(b, spec.kv_heads, s, d, **opts)
    gqa = spec.kv_heads != spec.num_heads
    try:
        choice = torch._fused_sdp_choice(q, kv, kv, attn_mask=None, dropout_p=spec.attn_dropout,
                                         is_causal=True, enable_gqa=gqa)
    except (RuntimeError, TypeError) as err:  # private API: report, never fail a measurement
        return f"unknown ({type(err).__name__})"
    names = {int(getattr(SDPBackend, n)): n for n in dir(SDPBackend)
             if n.isupper() and isinstance(getattr(SDPBackend, n), SDPBackend)}
    return names.get(int(choice), str(choice))


__all__ = ["Measurement", "measure", "memtracker_peaks", "sdpa_backend", "cpu_name", "PHASES"]
