"""``python -m transformer_pde.cli``: the ``transformer-pde`` command."""

import sys

from .main import main

sys.exit(main())
