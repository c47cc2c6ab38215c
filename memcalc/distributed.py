"""Alias of memcalc.parallel.data (moved there; this name is kept for one release)."""
from memcalc.parallel.data import *  # noqa: F401,F403
from memcalc.parallel.data import __all__  # noqa: F401
