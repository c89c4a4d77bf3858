"""``python -m elasticps``: the same as the ``elasticps`` command."""

import sys

from elasticps.cli import main

sys.exit(main())
