"""``python -m crossknn``: the ``crossknn`` command line."""

import sys

from crossknn.cli import main

if __name__ == "__main__":
    sys.exit(main())
