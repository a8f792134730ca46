"""``python -m megatron.training.port_upstream CHECKOUT``: see the package's docstring."""

import sys

from megatron.training.port_upstream import main

sys.exit(main())
