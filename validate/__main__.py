"""`python -m validate ...`: see validate/run/cli.py. Checks for torch before importing anything that
needs it, so a missing install is one line, not a traceback."""
from __future__ import annotations

import importlib.util
import sys


def _main() -> int:
    if importlib.util.find_spec("torch") is None:
        print("validate: torch is not installed; fix: pip install 'memcalc[validate]' "
              "(the validator runs real training steps)", file=sys.stderr)
        return 2
    from validate.run.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(_main())
