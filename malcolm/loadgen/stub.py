"""A stub server that answers every task after a fixed delay, for testing the load generator.

Example::

    with StubServer("udp", delay_us=500) as s:
        ...  # point the load generator at s.address; s.stall(1.0, 0.05) injects a stall

See :mod:`malcolm.loadgen._stub` for what it can do (stall, reject, drop, flags).
"""

from __future__ import annotations

import threading

from malcolm.loadgen._stub import StubCore
from malcolm.net.transport import format_addr, open_transport


class StubServer:
    """Run a :class:`~malcolm.loadgen._stub.StubCore` in a thread of this process.

    Parameters
    ----------
    transport : str
        ``udp`` or ``shm``.
    address : optional
        Where to bind (udp default ``127.0.0.1:0``; shm default: a unique name).
    **opts
        Passed to :class:`StubCore`: ``index``, ``delay_us``, ``every_reject``,
        ``reject_status``, ``every_drop``, ``every_migrated``, ``every_stolen``, ``busy``.
    """

    def __init__(self, transport="udp", address=None, **opts):
        self.tr = open_transport(transport, address)
        try:
            self.core = StubCore(self.tr, **opts)
        except BaseException:
            self.tr.close()
            raise
        self.kind = transport
        self._thread = None

    @property
    def address(self):
        """The address clients send to, as a string (``host:port`` or the shm name)."""
        return format_addr(self.tr.address)

    def start(self):
        self._thread = threading.Thread(target=self.core.run, daemon=True, name="loadgen-stub")
        self._thread.start()
        return self

    def stall(self, after_s, duration_s):
        """Answer nothing from ``after_s`` from now, for ``duration_s`` seconds."""
        self.core.stall(after_s, duration_s)

    def stop(self, timeout=5.0):
        """Stop the loop (within about 5 ms) and close the endpoint; returns the counters."""
        if self._thread is not None:
            self.core.stop()
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("stub server thread did not stop")
            self._thread = None
        self.tr.close()
        c = self.core
        return {"tasks": c.tasks, "answered": c.answered, "rejected": c.rejected,
                "ignored": c.ignored, "malformed": c.malformed, "overflow": c.overflow,
                "pending": c.pending}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
