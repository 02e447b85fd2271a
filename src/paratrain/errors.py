"""The one exception type for bad input.

Anything the user can fix (a flag, a path, a file) raises UsageError with a message that says what
is wrong and how to mend it; the CLI prints that line and exits with status 2.
"""


class UsageError(Exception):
    """Bad input: printed as one line on stderr, exit status 2."""
