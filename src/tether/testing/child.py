"""Entry point of a torture kill-run worker: ``python -m tether.testing.child APP FOLDER``."""

import sys

from tether.testing.chaos import run_child

if __name__ == "__main__":
    run_child(sys.argv[1], sys.argv[2])
