"""The live-tensor tracker counts exactly what is allocated and sees frees at once."""
import pytest

torch = pytest.importorskip("torch")

from validate.measure.tracker import LiveTensorTracker  # noqa: E402


def test_counts_a_known_allocation_exactly_and_sees_the_free():
    with LiveTensorTracker() as tr:
        a = torch.empty(1000, dtype=torch.float32)
        assert tr.live == 4000
        b = torch.empty(10, 10, dtype=torch.bfloat16)
        assert tr.live == 4000 + 200
        del a
        assert tr.live == 200
        del b
    assert tr.live == 0 and tr.peak == 4200


def test_views_share_one_storage():
    with LiveTensorTracker() as tr:
        a = torch.zeros(64, 64)
        v = a.t()[:3]
        del a
        assert tr.live == 64 * 64 * 4  # the view keeps the whole storage alive
        del v
    assert tr.live == 0


def test_peak_includes_inputs_and_output_of_an_op():
    with LiveTensorTracker() as tr:
        x = torch.ones(256)
        tr.reset_peak()
        y = x * 2  # x and y alive together
        del x, y
    assert tr.peak == 2 * 256 * 4


def test_out_argument_resize_is_seen():
    with LiveTensorTracker() as tr:
        out = torch.empty(0)
        torch.mul(torch.ones(100), 2, out=out)
        assert tr.live == 400  # the empty storage grew to 100 floats
    del out


def test_external_tensor_needs_track_tensor():
    t = torch.zeros(10)
    with LiveTensorTracker() as tr:
        assert tr.live == 0
        tr.track_tensor(t)
        assert tr.live == 40


def test_works_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), LiveTensorTracker() as tr:
        x = torch.empty(1 << 20, 1 << 10)  # 4 GiB, never allocated
        assert tr.live == 4 << 30
        del x
        assert tr.live == 0


def test_mark_and_peak_label():
    with LiveTensorTracker() as tr:
        tr.mark("small")
        a = torch.ones(10)
        tr.mark("big")
        b = torch.ones(1000)
        del a, b
    assert tr.peak_label == "big" and tr.peak == 4040


def _allocator_peak(prof) -> int:
    """Peak of the CPU allocator's live bytes over a profiled region (its [memory] events, in
    the order recorded: 'Ev Idx'), from the bytes live when it began."""
    import json
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = [e["args"] for e in json.load(open(f.name))["traceEvents"] if e.get("name") == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda a: a["Ev Idx"]):
        live += e["Bytes"]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("quant_type,double", [("nf4", True), ("fp4", False)])
def test_sees_inside_bitsandbytes_4bit_kernels_as_the_allocator_does(quant_type, double):
    """A Linear4bit forward and backward on CPU: gemm_4bit's Python kernel dequantises the weight
    into a temporary the process holds. The tracker, seeing inside SEE_INSIDE's kernels, reaches
    the peak of the CPU allocator's own alloc/free stream (torch.profiler profile_memory); a mode
    blind to them misses the dequantised weight in forward."""
    bnb = pytest.importorskip("bitsandbytes")
    from torch.profiler import ProfilerActivity, profile

    import validate.measure.tracker as tracker

    def layer():
        lin = bnb.nn.Linear4bit(256, 128, bias=False, compute_dtype=torch.bfloat16, quant_type=quant_type,
                                compress_statistics=double, device="meta")
        lin.weight = bnb.nn.Params4bit(torch.randn(128, 256), requires_grad=False, quant_type=quant_type,
                                       compress_statistics=double)
        return lin.to("cpu")

    def step(lin, backward: bool):
        x = torch.randn(16, 256).requires_grad_()
        y = lin(x).float().sum()
        if backward:
            y.backward()

    step(layer(), True)  # warm-up: bitsandbytes' lazy tables
    lin = layer()
    peaks = {}
    for name, see, backward in (("step", tracker.SEE_INSIDE, True), ("forward", tracker.SEE_INSIDE, False),
                                ("blind forward", frozenset(), False)):
        old, tracker.SEE_INSIDE = tracker.SEE_INSIDE, see
        try:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
                    LiveTensorTracker() as tr:
                tr.track_tensor(lin.weight)  # made before: the allocator's stream starts without it
                base = tr.live
                step(lin, backward)
        finally:
            tracker.SEE_INSIDE = old
        peaks[name] = (tr.peak - base, _allocator_peak(prof))
    assert peaks["step"][0] == peaks["step"][1]
    # the forward's own peak is inside F.linear (where the allocator also sees the bf16 matmul's
    # scratch, never a tensor): x fp32, x.to(bf16), the bf16 dequantised weight, the output
    # [, the fp32 absmax per 64-block of nested statistics]
    held = 16 * 256 * 4 + 16 * 256 * 2 + 128 * 256 * 2 + 16 * 128 * 2 + (128 * 256 // 64 * 4 if double else 0)
    assert peaks["forward"][0] == held > peaks["blind forward"][0]
