"""`python -m gptlab`: the same as the `gptlab` command."""

import sys

from gptlab.cli.main import main

sys.exit(main())
