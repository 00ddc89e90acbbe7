"""``python -m txl`` works like ``txl``."""

import sys

from .cli import main

sys.exit(main())
