"""Alias of memcalc.parallel.tensor (moved there; this name is kept for one release)."""
from memcalc.parallel.tensor import *  # noqa: F401,F403
from memcalc.parallel.tensor import __all__  # noqa: F401
