"""The ``malcolm`` program's entry point (the console script and ``python -m malcolm``).

Click turns a Ctrl-C during a command into ``Aborted!``, but only once its ``main`` runs:
one during the ~40 ms that importing click and the CLI takes printed a ``KeyboardInterrupt``
traceback (``rack up`` stopping a server that had just started, a user's quick Ctrl-C). This
module is imported only by the program, never by a library user or the tests, so it may set
the process's SIGINT handler: a quiet exit while the CLI loads, Python's default again
(``KeyboardInterrupt``, which click reports) before any command runs. The interpreter's own
start-up, before this module, is outside its reach.
"""
import signal
import sys


def _aborted(signum, frame):
    sys.stderr.write("\nAborted!\n")
    raise SystemExit(128 + signum)


signal.signal(signal.SIGINT, _aborted)

from malcolm.cli import main  # noqa: E402


def run():
    """Run the ``malcolm`` command line with Python's SIGINT handling restored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
