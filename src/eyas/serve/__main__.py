"""``python -m eyas.serve ...`` is ``eyas serve ...``: same flags, same error handling and exit codes."""

import sys

from eyas.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
