"""``python -m txl`` works like ``txl``. Under torchrun the entry point is wrapped in torch's ``record``, so that
a process that fails with an exception has its rank and traceback reported by torchrun."""

import sys

from .cli import main
from .distributed import under_torchrun

if under_torchrun():
    from torch.distributed.elastic.multiprocessing.errors import record

    main = record(main)

sys.exit(main())
