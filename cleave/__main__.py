"""`python -m cleave ...`: the CLI of the `cleave` console script."""
import sys

from cleave.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
