"""`python -m spgc` runs the CLI."""

import sys

from spgc.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
