"""`python -m retrainer`: the retrainer process (retrainer/retrainer.py)."""

import sys

from retrainer.retrainer import main

sys.exit(main())
