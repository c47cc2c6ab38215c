"""The `memcalc` command (memcalc.cli.main)."""
from memcalc.cli.main import main

__all__ = ["main"]
