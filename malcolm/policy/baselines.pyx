# cython: language_level=3
"""Baseline load-balancing policies, behind the same interface as Malcolm's own policy.

They only use what a server legitimately knows: its own load at the start of each window
(``observe_local``) and its peers' heartbeats (``observe_peer``). The simulator and the real
runtime drive them identically.

Server-side policies (run in each server's gateway)
---------------------------------------------------
``random``  Every new task goes to a uniformly random server (itself included, which means
            accept). Never steals.
``jsq``     Join-shortest-queue on broadcast queue lengths: migrate to the server with the
            shortest known queue if it is strictly shorter than this server's own known queue
            (ties broken at random). Never steals.
``jbt``     Join-below-threshold: accept if this server's known queue is below ``threshold``;
            else migrate to a random server whose known queue is below it; if none is, accept.
            Never steals.
``jiq``     Join-idle-queue: a heartbeat reporting ``q < slots`` tasks puts that server on the
            idle list with ``slots - q`` credits; each task sent there uses one credit. Accept
            while this server has credits of its own, else migrate to a random server with
            credits, else accept. Never steals.
``sed``     Shortest expected delay: go to the server minimising ``(q + 1) / rate`` (queue and
            service rate from heartbeats) if that beats this server's own value. Never steals.
``steal``   Reference work stealer (mainly for tests): accepts every task; after each
            completion, if its own known queue is at most ``max_own``, steals from the peer
            with the longest known queue provided that queue is at least ``min_victim``
            (``min_victim=0``: from a random peer, blindly).

"Known queue" is the last reported value plus, when ``count_own`` is true (the default), the
tasks this gateway itself sent there since that report: a dispatcher remembers its own
decisions, which damps (but does not remove) herding within a broadcast period. Heartbeats
that arrive out of order (older ``seq`` than one already seen) are ignored.

Client-side policy
------------------
``po2``     Power-of-d in the client: sample ``d`` distinct servers (default 2) and send to the
            one with the shortest queue known from the loads piggybacked on responses (servers
            never heard from count as empty).
"""
from libc.stdint cimport int64_t
from libc.string cimport memset

from malcolm._core cimport rng_below
from malcolm.policy.base cimport ClientPolicy, Heartbeat, MAX_SERVERS, Policy


cdef class RandomPolicy(Policy):
    """Send each new task to a uniformly random server; never steal."""

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        return <int>rng_below(&self.rng, self.n)


cdef class HeartbeatView(Policy):
    """Base of the heartbeat-driven baselines: keeps the latest report of every server.

    Parameters
    ----------
    n, me, seed
        As for :class:`malcolm.policy.base.Policy`.
    count_own : bool
        Add the tasks this gateway sent to a server since its last report to its known queue.
    """

    def __init__(self, int n, int me, unsigned long long seed=0, bint count_own=True):
        Policy.__init__(self, n, me, seed)
        memset(self.q, 0, sizeof(self.q))
        memset(self.rate, 0, sizeof(self.rate))
        memset(self.load, 0, sizeof(self.load))
        memset(self.last_seq, 0, sizeof(self.last_seq))
        memset(self.heard, 0, sizeof(self.heard))
        self.count_own = count_own
        self.heard[me] = True

    cdef inline void _sent(self, int j) noexcept nogil:
        if self.count_own:
            self.q[j] += 1.0

    cdef void observe_local(self, int64_t now, double load, double queue_len,
                            double rate) noexcept nogil:
        self.q[self.me] = queue_len
        self.rate[self.me] = rate
        self.load[self.me] = load

    cdef void observe_peer(self, int64_t now, const Heartbeat* hb) noexcept nogil:
        cdef int j = hb.src
        if j < 0 or j >= self.n or j == self.me:
            return
        if self.heard[j] and <int>(hb.seq - self.last_seq[j]) <= 0:
            return          # stale: an older heartbeat overtaken by a newer one
        self.heard[j] = True
        self.last_seq[j] = hb.seq
        self.q[j] = hb.queue_len
        self.rate[j] = hb.rate
        self.load[j] = hb.load
        self._peer_updated(j)

    cdef void fill_heartbeat(self, Heartbeat* hb) noexcept nogil:
        Policy.fill_heartbeat(self, hb)
        hb.queue_len = self.q[self.me]
        hb.rate = self.rate[self.me]
        hb.load = self.load[self.me]

    cdef void _peer_updated(self, int j) noexcept nogil:
        pass

    def known(self):
        """The queue lengths this server currently believes (list, unheard peers as None)."""
        return [self.q[j] if self.heard[j] else None for j in range(self.n)]


cdef class JSQPolicy(HeartbeatView):
    """Migrate to the shortest known queue when it is strictly shorter than our own."""

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        cdef int n = self.n
        cdef int start = <int>rng_below(&self.rng, n)
        cdef int k, j, best = self.me
        cdef double bq = self.q[self.me]
        for k in range(n):
            j = start + k
            if j >= n:
                j -= n
            if self.heard[j] and self.q[j] < bq:
                bq = self.q[j]
                best = j
        self._sent(best)
        return best


cdef class JBTPolicy(HeartbeatView):
    """Join-below-threshold on known queue lengths (``threshold``, default 8 tasks)."""

    def __init__(self, int n, int me, unsigned long long seed=0, double threshold=8.0,
                 bint count_own=True):
        HeartbeatView.__init__(self, n, me, seed, count_own)
        if not threshold > 0:
            raise ValueError(f"jbt threshold must be > 0, got {threshold}")
        self.threshold = threshold

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        cdef int j, pick = self.me, seen = 0
        if self.q[self.me] < self.threshold:
            self._sent(self.me)
            return self.me
        for j in range(self.n):     # reservoir-sample one server below the threshold
            if j != self.me and self.heard[j] and self.q[j] < self.threshold:
                seen += 1
                if rng_below(&self.rng, seen) == 0:
                    pick = j
        self._sent(pick)
        return pick


cdef class JIQPolicy(HeartbeatView):
    """Join-idle-queue with ``slots`` credits per reported idle server (default 1)."""

    def __init__(self, int n, int me, unsigned long long seed=0, double slots=1.0,
                 bint count_own=True):
        HeartbeatView.__init__(self, n, me, seed, count_own)
        if not slots > 0:
            raise ValueError(f"jiq slots must be > 0, got {slots}")
        self.slots = slots
        memset(self.credit, 0, sizeof(self.credit))

    cdef void observe_local(self, int64_t now, double load, double queue_len,
                            double rate) noexcept nogil:
        HeartbeatView.observe_local(self, now, load, queue_len, rate)
        self.credit[self.me] = self.slots - queue_len if queue_len < self.slots else 0.0

    cdef void _peer_updated(self, int j) noexcept nogil:
        self.credit[j] = self.slots - self.q[j] if self.q[j] < self.slots else 0.0

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        cdef int j, pick = self.me, seen = 0
        if self.credit[self.me] >= 1.0:
            self.credit[self.me] -= 1.0
            self._sent(self.me)
            return self.me
        for j in range(self.n):
            if j != self.me and self.credit[j] >= 1.0:
                seen += 1
                if rng_below(&self.rng, seen) == 0:
                    pick = j
        if pick != self.me:
            self.credit[pick] -= 1.0
        self._sent(pick)
        return pick


cdef class SEDPolicy(HeartbeatView):
    """Shortest expected delay, ``(q + 1) / rate``, with rates from heartbeats."""

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        cdef int n = self.n
        cdef int start = <int>rng_below(&self.rng, n)
        cdef int k, j, best = self.me
        cdef double d, bd
        if self.rate[self.me] <= 0.0:
            self._sent(self.me)
            return self.me
        bd = (self.q[self.me] + 1.0) / self.rate[self.me]
        for k in range(n):
            j = start + k
            if j >= n:
                j -= n
            if self.heard[j] and self.rate[j] > 0.0:
                d = (self.q[j] + 1.0) / self.rate[j]
                if d < bd:
                    bd = d
                    best = j
        self._sent(best)
        return best


cdef class StealPolicy(HeartbeatView):
    """Accept everything; steal from the longest known queue after completions."""

    def __init__(self, int n, int me, unsigned long long seed=0, double min_victim=2.0,
                 double max_own=0.0, bint count_own=True):
        HeartbeatView.__init__(self, n, me, seed, count_own)
        if min_victim < 0:
            raise ValueError(f"steal min_victim must be >= 0, got {min_victim}")
        self.min_victim = min_victim
        self.max_own = max_own

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        self._sent(self.me)
        return self.me

    cdef int decide_steal(self, int64_t now) noexcept nogil:
        cdef int j, best = -1
        cdef double bq
        if self.n < 2:
            return -1
        if self.min_victim <= 0.0:
            j = <int>rng_below(&self.rng, self.n - 1)
            return j + 1 if j >= self.me else j
        # Called after each completion: one task fewer here, as each accept was one more
        # (count_own). Without it the own queue only grew between windows, and the test
        # below refused every steal but those right after a window found the server empty.
        if self.count_own and self.q[self.me] > 0.0:
            self.q[self.me] -= 1.0
        if self.q[self.me] > self.max_own:
            return -1
        bq = self.min_victim - 1e-9
        for j in range(self.n):
            if j != self.me and self.heard[j] and self.q[j] > bq:
                bq = self.q[j]
                best = j
        if best >= 0:
            self.q[best] -= 1.0     # one fewer there, as far as we know
        return best


cdef class PowerOfDClient(ClientPolicy):
    """Client-side power-of-d on queue lengths piggybacked on responses.

    Parameters
    ----------
    n : int
        Servers.
    seed, stream : int
        Random stream of this client.
    d : int
        Servers sampled per task (1..n); 0 (the default): 2, or 1 on a one-server rack,
        where the default would otherwise be an error nobody asked for.
    """

    def __init__(self, int n, unsigned long long seed=0, unsigned long long stream=0,
                 int d=0):
        ClientPolicy.__init__(self, n, seed, stream)
        if d == 0:
            d = min(2, n)
        if not 1 <= d <= n:
            raise ValueError(f"po2: d must be in 1..{n}, got {d}")
        self.d = d
        memset(self.q, 0, sizeof(self.q))

    cdef int pick(self, int64_t now) noexcept nogil:
        cdef int chosen[MAX_SERVERS]
        cdef int k = 0, i, j, dup, best = -1
        cdef double bq = 0.0
        while k < self.d:
            j = <int>rng_below(&self.rng, self.n)
            dup = 0
            for i in range(k):
                if chosen[i] == j:
                    dup = 1
                    break
            if dup:
                continue
            chosen[k] = j
            k += 1
            if best < 0 or self.q[j] < bq:
                best = j
                bq = self.q[j]
        return best

    cdef void on_response(self, int64_t now, int server, double load,
                          double queue_len) noexcept nogil:
        if 0 <= server < self.n:
            self.q[server] = queue_len

    def known(self):
        return [self.q[j] for j in range(self.n)]
