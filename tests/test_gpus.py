"""GPU catalogue, local detection and budget parsing."""
import pytest

from memcalc.core.errors import MemcalcError, UnknownNameError
from memcalc.inputs.gpus import CONTEXT_MIB, GPUS, gpu, local_gpus, parse_budget


def test_catalogue_covers_the_usual_cards():
    for name in ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L4", "A10G", "V100-16GB",
                 "V100-32GB", "RTX-3090", "RTX-4090", "L40S", "MI300X"]:
        g = GPUS[name]
        assert g.usable_bytes == g.total_bytes - CONTEXT_MIB * 2 ** 20 > 0
        assert g.tflops_fp16 > g.tflops_fp32 > 0


def test_lookup_is_case_insensitive_and_suggests():
    assert gpu("h200-141gb").name == "H200-141GB"
    with pytest.raises(UnknownNameError, match="H100-80GB"):
        gpu("H100")


@pytest.mark.parametrize("text,nbytes", [("80GB", 80 * 10 ** 9), ("24GiB", 24 * 2 ** 30),
                                         ("512 MiB", 512 * 2 ** 20), (12345, 12345), ("1e9", 10 ** 9)])
def test_sizes(text, nbytes):
    assert parse_budget(text) == nbytes


def test_gpu_budget_is_usable_memory():
    assert parse_budget("A100-80GB") == GPUS["A100-80GB"].usable_bytes


@pytest.mark.parametrize("bad", [-1, "-5GB", True, None, "12 parsecs"])
def test_bad_budgets(bad):
    with pytest.raises(MemcalcError):
        parse_budget(bad)


def test_local_without_driver_is_a_note_or_a_list():
    found, note = local_gpus()
    assert found or note
    if not found:
        with pytest.raises(MemcalcError, match="local"):
            parse_budget("local")
