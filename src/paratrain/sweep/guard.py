"""Imported by a fork server (the sweep's, and train's: paratrain/forkserver.py), and only there, as
it starts: die with the process that started it (the sweep driver, the train command).

Trial processes are children of the fork server, not of the driver, and each asks the kernel to
kill it when its parent dies (PR_SET_PDEATHSIG). For that to fire when the driver is killed, the
fork server must die with the driver too; multiprocessing's server does not on its own (it lives
on, with its trials, after a SIGKILL to the driver). The driver starts the server from its main
thread, because the signal follows the thread that forked a process, not the process.
"""

from paratrain.sweep.trial import die_with_parent

die_with_parent()
