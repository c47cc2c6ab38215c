"""Repository-wide pytest setup: the docstring examples in memcalc/ and validate/ run as tests
(pyproject: --doctest-modules, testpaths), the validator's only where torch is installed, and
those that run real training steps join the `slow` lane."""
from __future__ import annotations

import importlib.util

import pytest

# validate/ imports torch at module top; without it (an engine-only install) skip its doctests
# rather than fail collection. __main__.py is the `python -m validate` entry point, no examples.
collect_ignore = ["validate/__main__.py"]
if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["validate/*.py"]

# Doctests that run real training steps (or spawn gloo processes), or plan over many
# simulations, or search over many allocator replays on device bytes (check, the page's changes,
# the cluster planner, the tables): seconds each (20-33 s for the last four on this 2-core machine).
SLOW_DOCTESTS = ("validate.distributed.measure", "validate.distributed.tracker", "validate.models.hf",
                 "validate.measure.backends", "validate.measure.step", "memcalc.queries.planner.plan",
                 "memcalc.queries.capacity.min_world_size", "memcalc.traced.runner",
                 "memcalc.inputs.specs.ModelSpec.from_module", "validate.measure.module",
                 "memcalc.queries.preflight.check", "memcalc.serve.api.changes_answer",
                 "memcalc.queries.cluster", "memcalc.queries.tables.render")


def pytest_collection_modifyitems(items):
    for item in items:
        if isinstance(item, pytest.DoctestItem) and item.name.startswith(SLOW_DOCTESTS):
            item.add_marker(pytest.mark.slow)
