"""The launcher's guard: resumes the servers a dead launcher had paused, so that they can stop.

A launcher pauses servers with SIGSTOP (the benchmark runner pauses the racks of the policies
not running; the fault injector pauses a server). A stopped server cannot notice that its
launcher died: it neither polls its parent nor acts on the kernel's parent-death signal until
it runs again. The kernel resumes it only where its process group becomes *orphaned*, which
depends on who adopts it: a subreaper in the launcher's session (a CI harness, a container's
init, ``systemd --user``) keeps the group from being orphaned, and the server would stay
stopped, holding its ports, for ever.

So the launcher (``malcolm.runtime.launcher``) starts this small process once, with the read
end of a pipe as its standard input, and writes ``+PID`` for each server it starts and
``-PID`` for each it reaped. When the launcher dies, however it dies, the kernel closes the
pipe's write end; this process reads end-of-file and sends SIGCONT to every server still
listed. Each then sees that its launcher is gone and stops itself (``malcolm serve``).

It is run as a script (``python -I -S _guard.py``), not as part of the package, so that it
starts in milliseconds and imports nothing but the standard library. SIGCONT is all it sends:
harmless to a server that is running, and it never stops or kills anything itself.
"""

import os
import signal
import sys


def main():
    # The terminal's Ctrl-C and hang-up are for the launcher, which stops its rack in order;
    # this process only waits for the launcher's end.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    pids = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] in "+-" and line[1:].isdigit():
            (pids.add if line[0] == "+" else pids.discard)(int(line[1:]))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:             # gone already, or never ours to signal
            pass


if __name__ == "__main__":
    main()
