"""A small Python client for tests and tools: send tasks to a rack, account for every one.

It is not a load generator (``malcolm loadgen`` is): it runs in Python, so it measures
correctness, not latency. Every task ends in exactly one of: answered (by status), or lost
(no response before the deadline). Duplicated responses are counted separately, since the
runtime promises exactly one response per task.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from malcolm.net import wire
from malcolm.net.transport import open_transport

_MAX_BUDGET_US = 2**32 - 1         # the wire's u32 budget: about 71 minutes


def _check_timeout(timeout):
    """A task deadline in seconds: None, or a finite number > 0 (ValueError otherwise)."""
    if timeout is None:
        return None
    t = float(timeout)
    if not 0.0 < t < float("inf"):
        raise ValueError(f"a task timeout must be a finite number of seconds > 0, got "
                         f"{timeout!r}")
    return t


def _budget_us(timeout):
    """The wire's budget for a deadline ``timeout`` s from now: 0 (none) for None, else at
    least 1 µs (0 would mean none) and at most the u32 maximum."""
    if timeout is None:
        return 0
    return max(1, min(_MAX_BUDGET_US, int(timeout * 1e6)))


@dataclass
class Accounting:
    """What happened to the tasks a :class:`Client` sent."""

    sent: int = 0
    answered: dict = field(default_factory=dict)       # request_id -> first response (dict)
    duplicates: int = 0                                 # second answers (another message)
    replayed: int = 0           # copies of the answer taken (its epoch and seq): the network's
    malformed: int = 0
    forged: int = 0                                     # responses whose MAC did not verify
    pending: dict = field(default_factory=dict)        # request_id -> server index sent to

    @property
    def lost(self):
        """Tasks never answered (after ``collect`` gave up)."""
        return len(self.pending)

    def by_status(self):
        return Counter(wire.Status(r["status"]).name.lower() for r in self.answered.values())

    def by_server(self):
        return Counter(r["server"] for r in self.answered.values())

    def lost_by_server(self):
        return Counter(self.pending.values())

    def moved(self):
        """(migrated, stolen) counts among the answered tasks."""
        vals = list(self.answered.values())
        return (sum(1 for r in vals if r["flags"] & wire.MIGRATED),
                sum(1 for r in vals if r["flags"] & wire.STOLEN))

    def summary(self):
        mig, st = self.moved()
        return {"sent": self.sent, "answered": len(self.answered), "lost": self.lost,
                "duplicates": self.duplicates, "replayed": self.replayed,
                "malformed": self.malformed,
                "forged": self.forged,
                "status": dict(self.by_status()), "migrated": mig, "stolen": st,
                "by_server": dict(self.by_server()),
                "lost_by_server": dict(self.lost_by_server())}


class Client:
    """Send tasks to the servers of a rack and collect the responses.

    Parameters
    ----------
    transport : str
        ``udp`` or ``shm`` (or ``verbs``), as the rack uses.
    servers : list
        Server addresses by index.
    client_id : int
    address : optional
        Where to bind (udp default ``127.0.0.1:0``; shm default: a unique name).
    key : bytes or None
        The rack's 16-byte MAC key (``malcolm.runtime.config.rack_key``); None for a rack without
        one. Tasks are sealed with it and responses that do not verify are counted as
        ``forged`` and otherwise ignored; over verbs it also authenticates the address
        queries and answers of the client's endpoint.
    task_timeout : float or None
        Default deadline of each task, in seconds from its send: it travels in the task (wire
        v3 ``budget_us``, as the load generator sends it), so that a server refuses a task it
        cannot start in time (``overloaded``) or answers it ``timed_out`` instead of running
        it after the client gave up. None: no deadline (the rack's ``task_timeout_ms`` only).
    """

    def __init__(self, transport, servers, client_id=1, address=None, key=None,
                 task_timeout=None):
        self.tr = open_transport(transport, address, key=key)
        self.servers = [self.tr.parse(s) for s in servers]
        self.client_id = client_id
        self.key = key
        self.task_timeout = _check_timeout(task_timeout)
        self.epoch = wire.new_epoch()
        self._seq = [0] * len(self.servers)     # per server: each sees a dense sequence
        self.acc = Accounting()
        self._next = 0

    def close(self):
        self.tr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, server, task_type=0, service_ns=0, payload=b"", timeout=...):
        """Send one task to server index ``server``; return its request id.

        ``timeout`` (seconds; None: none) is the task's deadline, sent as its budget; by
        default the client's ``task_timeout``."""
        budget_us = _budget_us(self.task_timeout if timeout is ... else
                               _check_timeout(timeout))
        rid = self._next
        self._next += 1
        self._seq[server] += 1
        msg = wire.encode_task_native(self.client_id, rid, task_type, service_ns,
                                      time.monotonic_ns(), payload, key=self.key,
                                      epoch=self.epoch, auth_seq=self._seq[server],
                                      budget_us=budget_us)
        self.acc.pending[rid] = server
        self.acc.sent += 1
        self.tr.send(self.servers[server], msg)
        return rid

    def poll(self, timeout=0.0):
        """Receive what has arrived (waiting up to ``timeout`` s); return how many."""
        got = self.tr.recv(timeout)
        for data, _src in got:
            try:
                r = wire.decode_native(data, self.key)
            except wire.BadMessage as e:
                if e.code == wire.E_MAC:
                    self.acc.forged += 1
                else:
                    self.acc.malformed += 1
                continue
            if r["kind"] != "response" or r["client_id"] != self.client_id:
                self.acc.malformed += 1
                continue
            rid = r["request_id"]
            if rid in self.acc.answered:
                # the same datagram again (a network that duplicates, or a replay) is not
                # a second answer to the task
                first = self.acc.answered[rid]
                if (first["epoch"], first["auth_seq"]) == (r["epoch"], r["auth_seq"]):
                    self.acc.replayed += 1
                else:
                    self.acc.duplicates += 1
            elif rid in self.acc.pending:
                del self.acc.pending[rid]
                self.acc.answered[rid] = r
            else:
                self.acc.malformed += 1
        return len(got)

    def run(self, n, service_ns=10_000, rate=20_000.0, servers=None, task_type=0,
            payload=b"", timeout=5.0, task_timeout=...):
        """Send ``n`` tasks round-robin over ``servers`` (indices; default all) at about
        ``rate`` tasks/s, then collect responses until all are in or ``timeout`` s pass.
        ``task_timeout``: each task's deadline (see :meth:`send`)."""
        idx = list(range(len(self.servers))) if servers is None else list(servers)
        t0 = time.monotonic()
        for i in range(n):
            self.send(idx[i % len(idx)], task_type, service_ns, payload, task_timeout)
            due = t0 + (i + 1) / rate
            while time.monotonic() < due:
                if not self.poll(0.0):
                    time.sleep(min(0.0005, max(0.0, due - time.monotonic())))
            self.poll(0.0)
        return self.collect(timeout)

    def collect(self, timeout=5.0):
        """Wait until every sent task is answered or ``timeout`` s pass."""
        t_end = time.monotonic() + timeout
        while self.acc.pending and time.monotonic() < t_end:
            self.poll(min(0.05, max(0.0, t_end - time.monotonic())))
        return self.acc
