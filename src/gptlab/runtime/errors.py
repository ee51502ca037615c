"""The one family of user-facing errors.

A `GptlabError` is a mistake the user can fix (bad value, missing file, corrupt
input). Its message states the actual values and the fix; the CLI prints it as
one line and exits non-zero. Anything else is a bug and keeps its traceback.
"""


class GptlabError(ValueError):
    """A user mistake or bad input, reported in one line."""
