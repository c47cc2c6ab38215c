"""Alias of memcalc.parallel.fsdp (moved there; this name is kept for one release)."""
from memcalc.parallel.fsdp import *  # noqa: F401,F403
from memcalc.parallel.fsdp import __all__  # noqa: F401
