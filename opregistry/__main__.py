"""``python -m opregistry`` is the ``opregistry`` command."""

import sys

from .cli import main

sys.exit(main())
