"""The UD queue of the RDMA (verbs) transport: sends and receives without the GIL.

pyverbs (Debian's ``python3-pyverbs``) creates and owns every verbs object: the device
context, protection domain, completion queues, memory region, queue pair and address
handles. This module takes the raw ``ibv_cq*``, ``ibv_qp*`` and ``ibv_ah*`` out of those
objects once, and then drives them from ``noexcept nogil`` code with ``ibv_poll_cq``,
``ibv_post_send`` and ``ibv_post_recv``: no Python object per completion (pyverbs'
``CQ.poll`` makes one), buffers registered once and reused, receives reposted in batches.

Debian ships pyverbs without its ``.pxd`` files, so the pointers cannot be cimported. Every
pyverbs object of interest derives from ``pyverbs.base.PyverbsCM`` and keeps its verbs pointer
in the first field after that base (true in every pyverbs release since 2019). The offset is
read at run time from ``PyverbsCM.__basicsize__``, and each pointer is checked against what
pyverbs reports through Python (QP number and type, CQ size, owning context and PD) before it
is used, so a pyverbs with another layout gives a clear error instead of a crash.

Memory layout of the registered buffer (one MR): ``n_recv`` receive slots of
``GRH_BYTES + payload`` bytes, then ``n_send`` send slots of ``payload`` bytes. A receive
slot's wr_id is its index; a send's wr_id is its sequence number.
"""

from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcmp, memcpy, memmove, memset

from malcolm._core cimport mc_load_acq, mc_now_ns, mc_store_rel
from malcolm.net._ibverbs cimport *
from malcolm.net._wire cimport NetAddr

import numpy as np

cdef extern from *:
    """
    /* The verbs pointer pyverbs keeps in the first field after PyverbsCM. */
    static inline void *malcolm_pyverbs_ptr(PyObject *o, Py_ssize_t off) {
        return *(void **)((char *)o + off);
    }
    """
    void *malcolm_pyverbs_ptr(PyObject *o, Py_ssize_t off)


GRH_BYTES = GRH
"""Bytes at the start of every UD receive slot that hold the GRH, not payload."""


cdef Py_ssize_t _ptr_offset() except -1:
    from pyverbs.base import PyverbsCM
    return PyverbsCM.__basicsize__


cdef void *pyverbs_ptr(obj, str cls_name) except NULL:
    """The verbs pointer inside a pyverbs object, after checking the object's type."""
    from pyverbs.base import PyverbsCM
    cdef Py_ssize_t off = _ptr_offset()
    tp = type(obj)
    if not isinstance(obj, PyverbsCM) or tp.__name__ != cls_name:
        raise TypeError(f"expected a pyverbs {cls_name}, got {tp.__module__}.{tp.__name__}")
    if tp.__basicsize__ < off + sizeof(void *):
        raise RuntimeError(f"unsupported pyverbs layout for {cls_name} "
                           f"(basicsize {tp.__basicsize__}); see docs/rdma.md")
    cdef void *p = malcolm_pyverbs_ptr(<PyObject *>obj, off)
    if p == NULL:
        raise ValueError(f"the pyverbs {cls_name} is closed")
    return p


cdef object layout_error(str what):
    return RuntimeError(
        f"pyverbs object layout not recognised ({what}); malcolm.net._ud_queue reads the verbs "
        "pointer from the first field after pyverbs.base.PyverbsCM (pyverbs 28-50). "
        "Use Debian's python3-pyverbs 44 or update malcolm/net/_ud_queue.pyx.")


cdef class UDQueue:
    """One UD queue pair with its registered buffers, driven without the GIL.

    Build it with :class:`malcolm.net.verbs.Endpoint`, which creates the pyverbs objects;
    this class only borrows their pointers and keeps the objects alive. Call :meth:`close`
    before closing the pyverbs objects (it destroys the address handles made here).

    Parameters
    ----------
    qp, send_cq, recv_cq : pyverbs QP and CQ objects
        A UD queue pair in RTS state and its two completion queues.
    buf, lkey : int
        Address and local key of the registered buffer (pyverbs ``MR.buf`` / ``MR.lkey``).
    length : int
        Size of the registered buffer; must hold ``n_recv`` receive slots and ``n_send``
        send slots.
    n_recv, n_send : int
        Receive slots (at most the QP's receive queue depth) and send slots (at most its
        send queue depth).
    payload : int
        Largest message, in bytes (at most the path MTU).
    max_inline : int
        Messages up to this size are sent inline (copied into the work request).
    keep : object
        Anything that must outlive the queue (the pyverbs objects).
    pd : pyverbs PD, optional
        The QP's protection domain; needed to create address handles natively.
    port_num, sgid_index : int
        Port and source GID index for natively created address handles.
    """

    def __cinit__(self):
        self.staged_first = -1
        self.staged_last = -1

    def __init__(self, qp, send_cq, recv_cq, size_t buf, uint32_t lkey, size_t length,
                 int n_recv, int n_send, int payload, int max_inline=0, keep=None, pd=None,
                 int port_num=1, int sgid_index=0):
        if n_recv < 1 or n_send < 2 or payload < 1:
            raise ValueError("need n_recv >= 1, n_send >= 2 and payload >= 1")
        self.rslot = GRH + payload
        if <size_t>(n_recv * self.rslot + n_send * payload) > length:
            raise ValueError(f"registered buffer of {length} bytes is too small for "
                             f"{n_recv} receive and {n_send} send slots of {payload} bytes")
        cdef ibv_qp *q = <ibv_qp *>pyverbs_ptr(qp, "QP")
        cdef ibv_cq *s = <ibv_cq *>pyverbs_ptr(send_cq, "CQ")
        cdef ibv_cq *r = <ibv_cq *>pyverbs_ptr(recv_cq, "CQ")
        # Check each pointer against what pyverbs reports, so a layout change cannot go
        # unnoticed.
        if q.qp_num != qp.qp_num or <int>q.qp_type != <int>qp.qp_type:
            raise layout_error("QP number or type differs")
        if q.qp_type != IBV_QPT_UD:
            raise ValueError("UDQueue needs a UD queue pair")
        if s.cqe != send_cq.cqe or r.cqe != recv_cq.cqe:
            raise layout_error("CQ size differs")
        if q.send_cq != s or q.recv_cq != r or s.context != q.context:
            raise ValueError("send_cq and recv_cq must be the QP's own completion queues")
        cdef ibv_pd *p = NULL
        if pd is not None:
            p = <ibv_pd *>pyverbs_ptr(pd, "PD")
            if p != q.pd:
                raise layout_error("PD pointer is not the QP's PD")
        self.qp, self.scq, self.rcq, self.pd = q, s, r, p
        self.port_num, self.sgid_index = port_num, sgid_index
        self.base = <uint8_t *>buf
        self.lkey = lkey
        self.n_recv, self.n_send, self.payload = n_recv, n_send, payload
        self.max_inline = min(max_inline, payload)
        # Signal one send in every signal_every: send completions are reaped in bulk and the
        # ring can never fill with unsignalled work requests only.
        self.signal_every = max(1, min(16, n_send // 2))
        self.repost_batch = max(1, min(32, n_recv // 4))
        self.keep = keep
        self.rwr = <ibv_recv_wr *>calloc(n_recv, sizeof(ibv_recv_wr))
        self.rsge = <ibv_sge *>calloc(n_recv, sizeof(ibv_sge))
        self.repost = <int32_t *>calloc(n_recv, sizeof(int32_t))
        self.swr = <ibv_send_wr *>calloc(n_send, sizeof(ibv_send_wr))
        self.ssge = <ibv_sge *>calloc(n_send, sizeof(ibv_sge))
        self.cap_peers = 16
        self.peers = <Peer *>calloc(self.cap_peers, sizeof(Peer))
        self.intros = <Intro *>calloc(INTRO_CAP, sizeof(Intro))
        if _tables_rebuild(self, 32) != 0:
            raise MemoryError()
        if (self.intros == NULL or self.rwr == NULL or self.rsge == NULL
                or self.repost == NULL or self.swr == NULL
                or self.ssge == NULL or self.peers == NULL):
            raise MemoryError()
        cdef int i
        for i in range(n_recv):
            self.rsge[i].addr = <uint64_t>(self.base + i * self.rslot)
            self.rsge[i].length = <uint32_t>self.rslot
            self.rsge[i].lkey = lkey
            self.rwr[i].wr_id = i
            self.rwr[i].sg_list = &self.rsge[i]
            self.rwr[i].num_sge = 1
            self.repost[i] = i
        cdef uint8_t *sbase = self.base + n_recv * self.rslot
        for i in range(n_send):
            self.ssge[i].addr = <uint64_t>(sbase + i * payload)
            self.ssge[i].lkey = lkey
            self.swr[i].sg_list = &self.ssge[i]
            self.swr[i].num_sge = 1
            self.swr[i].opcode = IBV_WR_SEND
        self.n_repost = n_recv
        if uq_repost(self, 1) != 0:
            raise OSError("ibv_post_recv failed while posting the initial receives")

    def __dealloc__(self):
        self._destroy_ahs()
        free(self.rwr)
        free(self.rsge)
        free(self.repost)
        free(self.swr)
        free(self.ssge)
        free(self.peers)
        free(self.intros)
        free(self.ltab)
        free(self.qtab)

    cdef void _destroy_ahs(self) noexcept:
        cdef int i
        if self.peers == NULL:
            return
        for i in range(self.n_peers):
            if self.peers[i].owned_ah and self.peers[i].ah != NULL:
                ibv_destroy_ah(self.peers[i].ah)
            self.peers[i].ah = NULL
        self.n_peers = 0

    def close(self):
        """Stop using the verbs objects and destroy the address handles made here.

        Idempotent; every later send or poll does nothing.
        """
        self._destroy_ahs()
        self.qp = NULL
        self.keep = None

    @property
    def closed(self):
        return self.qp == NULL

    def add_peer(self, ah, uint32_t qpn, uint32_t qkey, bytes gid):
        """Register a remote queue pair; returns its peer index for :meth:`send`.

        Parameters
        ----------
        ah : pyverbs AH
            Address handle to the peer, on this queue's protection domain.
        qpn, qkey : int
            The peer's UD QP number and Q_Key.
        gid : bytes
            The peer's 16-byte GID, used to recognise its messages.
        """
        if self.qp == NULL:
            raise RuntimeError("the queue is closed")
        if len(gid) != 16:
            raise ValueError("gid must be 16 bytes")
        cdef ibv_ah *a = <ibv_ah *>pyverbs_ptr(ah, "AH")
        if a.context != self.qp.context:
            raise layout_error("AH context differs from the QP's")
        if a.pd != self.qp.pd:
            raise ValueError("the address handle must be on the queue pair's PD")
        cdef NetAddr none
        memset(&none, 0, sizeof(NetAddr))
        cdef int i = _peer_slot(self, &none)
        if i < 0:
            raise MemoryError()
        cdef Peer *p = &self.peers[i]
        p.ah = a
        p.owned_ah = 0
        p.qpn = qpn
        p.qkey = qkey
        memcpy(p.gid, <const char *>gid, 16)
        p.v4 = gid[:12] == b"\0" * 10 + b"\xff\xff"
        self.keep = (self.keep, ah)
        if _tab_add(self, self.qtab, _hash_qpn(qpn), i) != 0:
            raise MemoryError()
        return i

    @property
    def n_peers(self):
        return self.n_peers

    @property
    def in_flight(self):
        """Sends posted whose slots are not yet known to be free."""
        return self.send_head - self.send_tail

    def stats(self):
        """Counters as a dict (a snapshot, for reports and tests)."""
        return dict(sent=self.sent, received=self.received, recv_errors=self.recv_errors,
                    send_errors=self.send_errors, unknown_src=self.unknown_src,
                    send_full=self.send_full, truncated=self.truncated,
                    recv_batches=self.recv_batches, reposts=self.reposts,
                    ah_failed=self.ah_failed)

    # -- Python-facing wrappers (one call per batch; the nogil functions do the work) --------

    def send(self, int peer, const uint8_t[::1] data not None):
        """Send one message to a peer; False when the send ring is full (counted)."""
        cdef int rc, frc = 0
        if self.qp == NULL:
            raise RuntimeError("the queue is closed")
        with nogil:
            rc = uq_send(self, peer, &data[0] if data.shape[0] else NULL,
                         <uint32_t>data.shape[0])
            if rc == 1:
                frc = uq_flush(self)
        if rc == -2:
            raise ValueError(f"bad peer {peer} or message of {data.shape[0]} bytes "
                             f"(payload limit {self.payload})")
        if rc < 0 or frc < 0:
            raise OSError("ibv_post_send failed")
        return rc == 1

    def send_many(self, const int32_t[::1] peers not None, const uint8_t[:, ::1] msgs not None,
                  const uint32_t[::1] lens not None):
        """Send ``msgs[i][:lens[i]]`` to ``peers[i]`` in batched posts; returns how many went."""
        cdef Py_ssize_t i, n = peers.shape[0]
        if self.qp == NULL:
            raise RuntimeError("the queue is closed")
        if msgs.shape[0] < n or lens.shape[0] < n:
            raise ValueError("peers, msgs and lens must have the same length")
        cdef int rc = 0
        cdef Py_ssize_t done = 0
        with nogil:
            for i in range(n):
                if lens[i] > msgs.shape[1]:
                    rc = -2
                    break
                rc = uq_send(self, peers[i], &msgs[i, 0], lens[i])
                if rc != 1:
                    break
                done += 1
            if rc >= 0:
                rc = min(rc, uq_flush(self))
        if rc == -2:
            raise ValueError(f"bad peer or length at message {done}")
        if rc < 0:
            raise OSError("ibv_post_send failed")
        return done

    def recv_into(self, uint8_t[:, ::1] out not None, uint32_t[::1] lens not None,
                  int32_t[::1] peers not None):
        """Poll receives once, copying up to ``len(out)`` messages; returns the count.

        A message longer than ``out.shape[1]`` is truncated and counted in ``truncated``.
        """
        cdef int maxn = <int>min(out.shape[0], lens.shape[0], peers.shape[0], MAX_BURST)
        cdef UDMsg msgs[MAX_BURST]
        cdef int i, n
        cdef uint32_t w
        if self.qp == NULL:
            raise RuntimeError("the queue is closed")
        with nogil:
            n = uq_poll_recv(self, msgs, maxn)
            for i in range(n):
                w = msgs[i].length
                if w > out.shape[1]:
                    w = <uint32_t>out.shape[1]
                    self.truncated += 1
                memcpy(&out[i, 0], msgs[i].data, w)
                lens[i] = w
                peers[i] = msgs[i].peer
        if n < 0:
            raise OSError("ibv_poll_cq failed on the receive CQ")
        return n

    def recv(self, int max_msgs=64, double timeout=0.0):
        """Received messages as ``[(peer, bytes)]`` (test helper: one object per message)."""
        out = np.empty((max_msgs, self.payload), np.uint8)
        lens = np.empty(max_msgs, np.uint32)
        peers = np.empty(max_msgs, np.int32)
        cdef int64_t deadline = mc_now_ns() + <int64_t>(timeout * 1e9)
        n = self.recv_into(out, lens, peers)
        while n == 0 and mc_now_ns() < deadline:
            n = self.recv_into(out, lens, peers)
        return [(int(peers[i]), bytes(out[i, :lens[i]])) for i in range(n)]

    def reap(self):
        """Reap send completions; returns the number of sends still in flight."""
        with nogil:
            uq_reap(self)
        return self.send_head - self.send_tail


cdef inline uint32_t _hash_qpn(uint32_t qpn) noexcept nogil:
    return qpn * <uint32_t>2654435761U


cdef inline uint32_t _hash_addr(const NetAddr *a) noexcept nogil:
    cdef uint32_t w[6]
    cdef uint64_t h = <uint64_t>0x9E3779B97F4A7C15ULL
    cdef int i
    memcpy(w, a, 24)
    for i in range(6):
        h = (h ^ w[i]) * <uint64_t>0xff51afd7ed558ccdULL
    return <uint32_t>(h >> 29)


cdef int _tables_rebuild(UDQueue q, uint32_t size) noexcept nogil:
    """(Re)build both tables at ``size`` slots (a power of two) from the peer list."""
    cdef int32_t *lt = <int32_t *>malloc(size * sizeof(int32_t))
    cdef int32_t *qt = <int32_t *>malloc(size * sizeof(int32_t))
    cdef int i
    if lt == NULL or qt == NULL:
        free(lt)
        free(qt)
        return -1
    memset(lt, 0xff, size * sizeof(int32_t))
    memset(qt, 0xff, size * sizeof(int32_t))
    free(q.ltab)
    free(q.qtab)
    q.ltab, q.qtab, q.tmask, q.t_used = lt, qt, size - 1, 0
    for i in range(q.n_peers):
        if q.peers[i].logical.family != 0:
            _tab_put(q, q.ltab, _hash_addr(&q.peers[i].logical), i)
        if q.peers[i].qpn != 0:
            _tab_put(q, q.qtab, _hash_qpn(q.peers[i].qpn), i)
    return 0


cdef inline void _tab_put(UDQueue q, int32_t *tab, uint32_t h, int idx) noexcept nogil:
    h &= q.tmask
    while tab[h] >= 0:
        h = (h + 1) & q.tmask
    tab[h] = idx
    q.t_used += 1


cdef int _tab_add(UDQueue q, int32_t *tab, uint32_t h, int idx) noexcept nogil:
    """Insert, first growing both tables if they would get over a quarter full."""
    cdef bint is_l = tab == q.ltab
    if <uint32_t>(q.t_used + 1) * 4 > q.tmask + 1:
        if _tables_rebuild(q, (q.tmask + 1) * 2) != 0:
            return -1
        # The rebuild already holds idx if the peer's fields are set; adding it again would
        # only leave a duplicate, which lookups tolerate.
    _tab_put(q, q.ltab if is_l else q.qtab, h, idx)
    return 0


cdef int _peer_slot(UDQueue q, const NetAddr *logical) noexcept nogil:
    """Index of the peer with this logical address (a zero address always gets a new slot),
    growing the table when needed; -1 when out of memory."""
    cdef int i
    cdef Peer *grown
    if logical.family != 0:
        i = uq_find_logical(q, logical)
        if i >= 0:
            return i
    if q.n_peers >= MAX_PEERS:
        return -1
    if q.n_peers == q.cap_peers:
        grown = <Peer *>calloc(2 * q.cap_peers, sizeof(Peer))
        if grown == NULL:
            return -1
        memcpy(grown, q.peers, q.n_peers * sizeof(Peer))
        free(q.peers)
        q.peers = grown
        q.cap_peers *= 2
    i = q.n_peers
    memset(&q.peers[i], 0, sizeof(Peer))
    q.peers[i].logical = logical[0]
    q.n_peers += 1
    if logical.family != 0 and _tab_add(q, q.ltab, _hash_addr(logical), i) != 0:
        q.n_peers -= 1
        return -1
    return i


cdef int uq_find_logical(UDQueue q, const NetAddr *a) noexcept nogil:
    """Index of the peer registered under transport address ``a``, or -1."""
    cdef uint32_t h = _hash_addr(a) & q.tmask
    cdef int32_t i
    while True:
        i = q.ltab[h]
        if i < 0:
            return -1
        if memcmp(&q.peers[i].logical, a, sizeof(NetAddr)) == 0:
            return i
        h = (h + 1) & q.tmask


cdef int uq_set_peer(UDQueue q, const NetAddr *logical, const uint8_t *gid, uint32_t qpn,
                     uint32_t qkey, uint16_t lid) noexcept nogil:
    """Register (or update, after a restart) the peer at ``logical``, creating its address
    handle with ``ibv_create_ah``. Returns the peer index, or -1 (counted in ah_failed)."""
    cdef ibv_ah_attr attr
    cdef ibv_ah *ah
    cdef Peer *p
    cdef int i
    if q.qp == NULL or q.pd == NULL:
        return -1
    i = uq_find_logical(q, logical) if logical.family != 0 else -1
    if i >= 0:
        p = &q.peers[i]
        if p.qpn == qpn and p.qkey == qkey and memcmp(p.gid, gid, 16) == 0:
            return i
    memset(&attr, 0, sizeof(attr))
    attr.is_global = 1
    memcpy(attr.grh.dgid.raw, gid, 16)
    attr.grh.sgid_index = <uint8_t>q.sgid_index
    attr.grh.hop_limit = 64
    attr.dlid = lid
    attr.port_num = <uint8_t>q.port_num
    ah = ibv_create_ah(q.pd, &attr)
    if ah == NULL:
        q.ah_failed += 1
        return -1
    if i < 0:
        i = _peer_slot(q, logical)
        if i < 0:
            ibv_destroy_ah(ah)
            q.ah_failed += 1
            return -1
    p = &q.peers[i]
    if p.owned_ah and p.ah != NULL:
        ibv_destroy_ah(p.ah)
    p.ah = ah
    p.owned_ah = 1
    if p.qpn != qpn:
        p.qpn = qpn
        if _tab_add(q, q.qtab, _hash_qpn(qpn), i) != 0:
            q.ah_failed += 1
            p = &q.peers[i]
            p.qpn = 0       # unreachable by receives, but no dangling state
    p = &q.peers[i]
    p.qkey = qkey
    memcpy(p.gid, gid, 16)
    cdef uint8_t v4[12]
    memset(v4, 0, 10)
    v4[10] = 0xff
    v4[11] = 0xff
    p.v4 = memcmp(gid, v4, 12) == 0
    return i


cdef bint uq_push_intro(UDQueue q, const NetAddr *frm, const uint8_t *msg) noexcept nogil:
    """Queue a checked introduction for the polling thread (single producer). False if full."""
    cdef uint64_t h = q.ihead
    if h - mc_load_acq(&q.itail) >= INTRO_CAP:
        return False
    q.intros[h % INTRO_CAP].frm = frm[0]
    memcpy(q.intros[h % INTRO_CAP].msg, msg, CTL_LEN)
    mc_store_rel(&q.ihead, h + 1)
    return True


cdef int uq_drain_intros(UDQueue q) noexcept nogil:
    """Turn queued introductions into peers (polling thread only); returns how many."""
    cdef uint64_t t = q.itail, h = mc_load_acq(&q.ihead)
    cdef int n = 0, i
    cdef int64_t now = mc_now_ns() if t < h else 0
    cdef Intro *it
    while t < h:
        it = &q.intros[t % INTRO_CAP]
        i = uq_set_peer(q, &it.frm, &it.msg[16], ld32be(&it.msg[8]), ld32be(&it.msg[12]),
                        (<uint16_t>it.msg[6] << 8) | it.msg[7])
        if i >= 0:
            q.peers[i].last_rx_ns = now         # a query or an answer: it is alive
            n += 1
        t += 1
    mc_store_rel(&q.itail, t)
    return n


cdef int uq_repost(UDQueue q, bint force) noexcept nogil:
    """Post the receive slots given back since the last call as one chained work request."""
    cdef int i, n = q.n_repost
    if q.qp == NULL:
        return 0
    if n == 0 or (not force and n < q.repost_batch and q.posted_recv > q.n_recv // 2):
        return 0
    for i in range(n - 1):
        q.rwr[q.repost[i]].next = &q.rwr[q.repost[i + 1]]
    q.rwr[q.repost[n - 1]].next = NULL
    cdef ibv_recv_wr *bad = NULL
    cdef int rc = ibv_post_recv(q.qp, &q.rwr[q.repost[0]], &bad)
    if rc != 0:
        # Keep the slots that did not go on the list for the next try.
        i = 0
        while i < n and &q.rwr[q.repost[i]] != bad:
            i += 1
        q.posted_recv += i
        memmove(q.repost, q.repost + i, (n - i) * sizeof(int32_t))
        q.n_repost = n - i
        return -1
    q.posted_recv += n
    q.n_repost = 0
    q.reposts += 1
    return 0


cdef inline int _match_peer(UDQueue q, const uint8_t *grh, uint32_t src_qp,
                            unsigned int flags) noexcept nogil:
    cdef uint32_t h = _hash_qpn(src_qp) & q.tmask
    cdef int32_t i
    cdef Peer *p
    while True:
        i = q.qtab[h]
        if i < 0:
            return -1
        h = (h + 1) & q.tmask
        p = &q.peers[i]
        if p.qpn != src_qp or p.ah == NULL:
            continue
        if not (flags & IBV_WC_GRH):
            return i
        if p.v4:
            if memcmp(grh + 32, p.gid + 12, 4) == 0:
                return i
        elif memcmp(grh + 8, p.gid, 16) == 0:
            return i


cdef int uq_poll_recv(UDQueue q, UDMsg *out, int max_msgs) noexcept nogil:
    """Poll the receive CQ once; fills ``out`` with up to ``max_msgs`` messages.

    The data pointers stay valid until the next call, which gives their slots back to the
    receive queue (in one batched post). Messages from unknown senders and failed receives
    are counted and dropped. Returns the count, or -1 when polling fails.
    """
    cdef int n
    if q.qp == NULL:
        return 0
    uq_repost(q, 0)
    if max_msgs > WC_BATCH:
        max_msgs = WC_BATCH
    if q.n_stash > 0:
        n = min(q.n_stash, max_msgs)
        memcpy(q.wcs, q.stash, n * sizeof(ibv_wc))
        memmove(q.stash, q.stash + n, (q.n_stash - n) * sizeof(ibv_wc))
        q.n_stash -= n
    else:
        n = ibv_poll_cq(q.rcq, max_msgs, q.wcs)
    if n <= 0:
        if q.posted_recv == 0:
            uq_repost(q, 1)
        return n
    q.recv_batches += 1
    cdef int i, k = 0, peer
    cdef int32_t slot
    cdef uint8_t *b
    cdef ibv_wc *wc
    cdef bint drained = False
    for i in range(n):
        wc = &q.wcs[i]
        slot = <int32_t>wc.wr_id
        q.posted_recv -= 1
        q.repost[q.n_repost] = slot
        q.n_repost += 1
        if wc.status != IBV_WC_SUCCESS or wc.byte_len < GRH:
            q.recv_errors += 1
            continue
        b = q.base + slot * q.rslot
        peer = _match_peer(q, b, wc.src_qp, wc.wc_flags)
        if peer < 0 and not drained:
            # The sender may have introduced itself a moment ago.
            drained = True
            if uq_drain_intros(q) > 0:
                peer = _match_peer(q, b, wc.src_qp, wc.wc_flags)
        if peer < 0:
            q.unknown_src += 1
            continue
        out[k].data = b + GRH
        out[k].length = wc.byte_len - GRH
        out[k].peer = peer
        k += 1
    q.received += k
    if q.posted_recv == 0:
        uq_repost(q, 1)
    return k


cdef int uq_reap(UDQueue q) noexcept nogil:
    """Reap send completions; a signalled completion frees every slot before it."""
    cdef int i, n
    cdef uint64_t seq
    cdef ibv_wc wcs[WC_BATCH]
    if q.qp == NULL:
        return 0
    while True:
        n = ibv_poll_cq(q.scq, WC_BATCH, wcs)
        if n < 0:
            return -1
        for i in range(n):
            if wcs[i].status != IBV_WC_SUCCESS:
                q.send_errors += 1
            seq = wcs[i].wr_id + 1
            if seq > q.send_tail:
                q.send_tail = seq
        if n < WC_BATCH:
            return 0


cdef int uq_send(UDQueue q, int peer, const uint8_t *data, uint32_t length) noexcept nogil:
    """Stage one message to ``peer``; :func:`uq_flush` posts what is staged.

    Returns 1 when staged, 0 when the send ring is full (counted in ``send_full``), -2 for a
    bad peer or length, -1 when posting a full batch failed.
    """
    if q.qp == NULL:
        return -1
    if peer < 0 or peer >= q.n_peers or length > <uint32_t>q.payload or q.peers[peer].ah == NULL:
        return -2
    if q.send_head - q.send_tail >= <uint64_t>q.n_send:
        uq_reap(q)
        if q.send_head - q.send_tail >= <uint64_t>q.n_send:
            q.send_full += 1
            return 0
    cdef int idx = <int>(q.send_head % <uint64_t>q.n_send)
    cdef ibv_send_wr *wr = &q.swr[idx]
    cdef Peer *p = &q.peers[peer]
    if length:
        memcpy(<void *>q.ssge[idx].addr, data, length)
    q.ssge[idx].length = length
    wr.wr_id = q.send_head
    wr.next = NULL
    wr.send_flags = 0
    if length <= <uint32_t>q.max_inline:
        wr.send_flags = IBV_SEND_INLINE
    # Signal periodically, and always when the ring is about to fill up.
    if (q.send_head % <uint64_t>q.signal_every == <uint64_t>(q.signal_every - 1)
            or q.send_head - q.send_tail + 1 >= <uint64_t>q.n_send):
        wr.send_flags = wr.send_flags | IBV_SEND_SIGNALED
    wr.wr.ud.ah = p.ah
    wr.wr.ud.remote_qpn = p.qpn
    wr.wr.ud.remote_qkey = p.qkey
    if q.staged_first < 0:
        q.staged_first = idx
    else:
        q.swr[q.staged_last].next = wr
    q.staged_last = idx
    q.n_staged += 1
    q.send_head += 1
    if q.n_staged >= 32:
        if uq_flush(q) < 0:
            return -1
    return 1


cdef int uq_flush(UDQueue q) noexcept nogil:
    """Post every staged send as one chained work request. Returns 0, or -1 on failure."""
    if q.staged_first < 0 or q.qp == NULL:
        return 0
    cdef ibv_send_wr *bad = NULL
    cdef int n = q.n_staged
    cdef int rc = ibv_post_send(q.qp, &q.swr[q.staged_first], &bad)
    q.staged_first = -1
    q.staged_last = -1
    q.n_staged = 0
    if rc != 0:
        # Count what did not go. Its slots come free with the next signalled completion (one
        # send in every signal_every is signalled), so the ring cannot leak.
        while bad != NULL:
            q.send_errors += 1
            n -= 1
            bad = bad.next
        q.sent += n
        return -1
    q.sent += n
    return 0
