"""`python -m worker` is `incident-worker`."""

import sys

from .cli import main

sys.exit(main())
