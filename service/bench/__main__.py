"""``python -m service.bench``: the same command as ``message-committer bench``."""

import sys

from service.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
