"""The ways a command ends badly.

Anything the user can fix (a flag, a path, a file) raises UsageError with a message that says what
is wrong and how to mend it; the CLI prints that line and exits with status 2. A run that started
but did not complete (a rank died, the loss diverged) raises a RunFailed: one line, exit status 1,
and summary.json says what happened. A run the user stopped (Ctrl-C) raises a KeyboardInterrupt, as
Python does; `Interrupted` says what was kept: exit status 130, the shell's for SIGINT.
"""


class UsageError(Exception):
    """Bad input: printed as one line on stderr, exit status 2."""


class RunFailed(RuntimeError):
    """The run started and did not complete: printed as one line on stderr, exit status 1."""


class TrainingDiverged(RunFailed):
    """The loss became NaN or infinite; the run stopped itself with summary status `diverged`."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run: printed as one line (what the run kept, how to keep more), exit status 130."""
