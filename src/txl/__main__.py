"""``python -m txl`` works like ``txl`` (:func:`txl.cli.main`: it parses the command line, applies the command's
thread policy before anything imports torch, then runs it)."""

import sys

from .cli import main

sys.exit(main())
