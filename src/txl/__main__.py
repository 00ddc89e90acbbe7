"""``python -m txl`` works like ``txl``. The thread policy (:mod:`txl.threads`) is chosen first, before anything
imports torch. Under torchrun the entry point is wrapped in torch's ``record``, so that a process that fails with
an exception has its rank and traceback reported by torchrun."""

import sys

from .threads import at_launch

at_launch(sys.argv[1:])

from .cli import main  # noqa: E402  (after the thread policy: the CLI's commands import torch)
from .distributed import under_torchrun  # noqa: E402

if under_torchrun():
    from torch.distributed.elastic.multiprocessing.errors import record

    main = record(main)

sys.exit(main())
