"""Suite-wide settings.

Hypothesis draws examples from a seed fixed per test by default, so a run of `make test` (and CI)
is reproducible: a red run is red again. `HYPOTHESIS_PROFILE=explore make test` draws fresh
random examples on each run, to hunt for new failures.
"""

import os

from hypothesis import settings

settings.register_profile("default", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
