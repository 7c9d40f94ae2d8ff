"""`python -m throughway ...` (also what `torchrun -m throughway` runs)."""

import sys

from .cli import main

sys.exit(main())
