# cython: language_level=3
"""Default implementations of the policy interface (see ``base.pxd`` for the contract)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memset

from malcolm._core cimport rng_below, rng_seed


cdef int heartbeat_init(Heartbeat* hb, int src, uint32_t seq, int64_t sent_ns, double load,
                        double queue_len, double rate, uint64_t migrations, uint64_t steals,
                        object theta, int svc_lg=0) except -1:
    """Fill ``hb`` from its fields (the one place a heartbeat is built from values).

    ``theta``: the critic parameters (any sequence of numbers), or None for none; raises
    ValueError over ``MAX_THETA``. ``svc_lg``: the speed code (0: not known; raises
    ValueError outside 0..``MAX_SVC_LG``). Everything else, the unused theta tail included,
    is zero.
    """
    cdef int k, nt = 0 if theta is None else len(theta)
    if nt > MAX_THETA:
        raise ValueError(f"at most {MAX_THETA} critic parameters, got {nt}")
    if not 0 <= svc_lg <= MAX_SVC_LG:
        raise ValueError(f"svc_lg={svc_lg} must be in 0..{MAX_SVC_LG}")
    memset(hb, 0, sizeof(Heartbeat))
    hb.src = src
    hb.seq = seq
    hb.sent_ns = sent_ns
    hb.load = load
    hb.queue_len = queue_len
    hb.rate = rate
    hb.migrations = migrations
    hb.steals = steals
    hb.n_theta = nt
    hb.svc_lg = svc_lg
    for k in range(nt):
        hb.theta[k] = theta[k]
    return 0


# The sequence number py_observe_peer gives a heartbeat when the caller names none: newer than
# every one it delivered before, whatever the peer.
cdef uint32_t _py_seq = 0


cdef class Policy:
    """Base class: accept every task, never steal.

    Parameters
    ----------
    n : int
        Number of servers in the rack (1..64).
    me : int
        Index of the server this policy instance runs on.
    seed : int
        Seed of the gateway's random generator; ``me`` selects the stream.
    """

    def __init__(self, int n, int me, unsigned long long seed=0):
        if not 1 <= n <= MAX_SERVERS:
            raise ValueError(f"rack size n={n} must be in 1..{MAX_SERVERS}")
        if not 0 <= me < n:
            raise ValueError(f"server index me={me} must be in 0..{n - 1}")
        self.n = n
        self.me = me
        self.migrations = 0
        self.steals = 0
        self.n_workers = 1
        rng_seed(&self.rng, seed, <unsigned long long>me + 1)

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        return self.me

    cdef int decide_steal(self, int64_t now) noexcept nogil:
        return -1

    cdef bint grant_steal(self, int64_t now, double waiting, double rate) noexcept nogil:
        """A peer asks this server for a waiting task: give one (True) or answer empty.

        ``waiting`` tasks wait here and the server serves ``rate`` tasks per ns. The
        gateway asks only while a task waits; the default gives one."""
        return True

    cdef void observe_local(self, int64_t now, double load, double queue_len,
                            double rate) noexcept nogil:
        pass

    cdef void observe_completions(self, uint64_t n, double log_sum,
                                  double sum_ns) noexcept nogil:
        pass        # only a policy that compares speeds keeps them (AgentState)

    cdef void observe_peer(self, int64_t now, const Heartbeat* hb) noexcept nogil:
        pass

    cdef void end_window(self, int64_t now) noexcept nogil:
        pass

    cdef void fill_heartbeat(self, Heartbeat* hb) noexcept nogil:
        memset(hb, 0, sizeof(Heartbeat))
        hb.src = self.me
        hb.migrations = self.migrations
        hb.steals = self.steals

    @property
    def workers(self):
        """This server's worker count (>= 1): the window driver sets it from its estimator
        at each own observation; 1 until then."""
        return self.n_workers

    @workers.setter
    def workers(self, int value):
        if value < 1:
            raise ValueError(f"workers={value} must be >= 1")
        self.n_workers = value

    # Python entry points, for tests and tools; the drivers use the cdef methods.
    def py_decide_arrival(self, int64_t now=0, int task_type=0):
        """Return the server a new task should go to (``me`` accepts it)."""
        return self.decide_arrival(now, task_type)

    def py_decide_steal(self, int64_t now=0):
        """Return the victim to steal from after a completion, or -1."""
        return self.decide_steal(now)

    def py_grant_steal(self, double waiting, double rate, int64_t now=0):
        """``grant_steal`` from Python (tests)."""
        return bool(self.grant_steal(now, waiting, rate))

    def py_observe_local(self, int64_t now, double load, double queue_len, double rate):
        self.observe_local(now, load, queue_len, rate)

    def py_observe_peer(self, int64_t now, int src, double load, double queue_len=0.0,
                        double rate=0.0, theta=None, migrations=0, steals=0, seq=None,
                        sent_ns=None, int svc_lg=0):
        """Deliver a heartbeat from peer ``src`` at ``now``, as the transport would.

        It was sent at ``sent_ns`` (default ``now``) with sequence number ``seq`` (default:
        newer than every heartbeat this method delivered before).
        """
        global _py_seq
        cdef Heartbeat hb
        if not 0 <= src < self.n:
            raise ValueError(f"peer index {src} out of range 0..{self.n - 1}")
        if seq is None:
            _py_seq += 1
            seq = _py_seq
        elif <int32_t>(<uint32_t>seq - _py_seq) > 0:
            _py_seq = seq
        heartbeat_init(&hb, src, seq, now if sent_ns is None else sent_ns, load, queue_len,
                       rate, migrations, steals, theta, svc_lg)
        self.observe_peer(now, &hb)

    def py_end_window(self, int64_t now):
        self.end_window(now)

    def py_heartbeat(self):
        """Return this server's heartbeat as a dict."""
        cdef Heartbeat hb
        self.fill_heartbeat(&hb)
        return dict(src=hb.src, load=hb.load, queue_len=hb.queue_len, rate=hb.rate,
                    migrations=hb.migrations, steals=hb.steals, svc_lg=hb.svc_lg,
                    theta=[hb.theta[k] for k in range(hb.n_theta)])

    def py_completions(self, uint64_t n, double log_sum, double sum_ns):
        """``observe_completions``: this server's completion totals, as the window driver
        passes them before each own observation (``est_totals``: the count, the sums of ln
        service ns and of ns)."""
        self.observe_completions(n, log_sum, sum_ns)


cdef class ClientPolicy:
    """Base client-side policy: uniform random server."""

    def __init__(self, int n, unsigned long long seed=0, unsigned long long stream=0):
        if not 1 <= n <= MAX_SERVERS:
            raise ValueError(f"rack size n={n} must be in 1..{MAX_SERVERS}")
        self.n = n
        rng_seed(&self.rng, seed, 1000003 + stream)

    cdef int pick(self, int64_t now) noexcept nogil:
        return <int>rng_below(&self.rng, self.n)

    cdef void on_response(self, int64_t now, int server, double load,
                          double queue_len) noexcept nogil:
        pass

    def py_pick(self, int64_t now=0):
        return self.pick(now)

    def py_on_response(self, int64_t now, int server, double load, double queue_len=0.0):
        self.on_response(now, server, load, queue_len)
