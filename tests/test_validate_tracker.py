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
