"""``python -m homelab.cli``: the same as the ``homelab`` console script."""

import sys

from homelab.cli import main

if __name__ == "__main__":
    sys.exit(main())
