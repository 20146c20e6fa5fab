# cython: language_level=3
"""Result assembly of the rack simulator: a finished :class:`~malcolm.sim._engine.Engine`'s C
counters and per-task arrays as numpy arrays and Python numbers (once per run, with the GIL;
the event loop itself is in ``_engine.pyx``)."""
from libc.stdint cimport int32_t, int64_t, uint8_t

import numpy as np

from malcolm.sim._engine cimport Engine, Server


def collect(Engine e):
    """The raw results of a run that has finished: a dict of numpy arrays and counters
    (what ``Engine.run`` returns; :func:`malcolm.sim.run.simulate` turns it into a
    ``SimResult``)."""
    cdef int s
    cdef Server* v
    n = e.n_tasks
    out = dict(
        latency_ns=np.array(<int64_t[:n]>e.lat, copy=True),
        sent_ns=np.array(<int64_t[:n]>e.sent, copy=True),
        types=np.array(<int32_t[:n]>e.ttype, copy=True),
        service_ns=np.array(<double[:n]>e.svc, copy=True),
        dropped=np.array(<uint8_t[:n]>e.dropped, copy=True).astype(bool),
        generated=e.generated, completed=e.completed - e.n_dropped,
        n_dropped=e.n_dropped,
        events=e.events, end_ns=e.now, area=e.area, loop_s=e.loop_s,
        work_measured_ns=e.work_measured,
        hb_sent=e.hb_sent, hb_lost=e.hb_lost, hb_overrun=e.hb_overrun,
    )
    fields = ("accepted", "completed", "migrations", "steals", "steal_requests",
              "steal_empty", "bad_decisions", "busy_ns", "load_sum", "q_sum", "windows",
              "dropped", "gateway_msgs", "steal_suppressed", "steal_timeouts",
              "steals_in_flight_max", "ntasks_end", "queue_end")
    rows = []
    for s in range(e.n):
        v = &e.servers[s]
        rows.append((v.accepted, v.completed, v.migrations, v.steals, v.steal_requests,
                     v.steal_empty, v.bad_decisions, v.busy_ns, v.load_sum, v.q_sum, v.windows,
                     v.dropped, v.gw_msgs, v.steal.suppressed, v.steal.timeouts,
                     v.steal.max_seen, v.ntasks, v.queue.count + v.stolen.count))
    out["server"] = {f: np.array(col) for f, col in zip(fields, zip(*rows))}
    if e.record:
        # Row r holds every server's r-th configured window: only the rows that every server
        # wrote (a server whose first window came later may lack the last one).
        rows = min([e.servers[s].rec_rows for s in range(e.n)] + [e.rec.rows])
        out["rec_load_ns"] = _table(e.rec.load, rows, e.n)
        out["rec_queue"] = _table(e.rec.queue, rows, e.n)
        out["rec_true_ns"] = _table(e.rec.true_load, rows, e.n)
    return out


cdef object _table(double* p, int64_t rows, int n):
    """The first ``rows`` rows of an ``n``-column C array, copied into numpy."""
    if rows <= 0:
        return np.zeros((0, n))
    return np.array(<double[:rows * n]>p, copy=True).reshape(rows, n)
