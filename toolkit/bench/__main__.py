"""``python -m toolkit.bench``: the same command as ``message-committer bench``."""

import sys

from toolkit.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
