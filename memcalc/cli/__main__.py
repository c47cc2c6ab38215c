"""`python -m memcalc.cli`."""
import sys

from memcalc.cli.main import main

sys.exit(main())
