"""Native data path of the RDMA (verbs) transport: UD sends and receives without the GIL.

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

from malcolm.net._wire cimport MAX_MSG, NetAddr
from malcolm.net.transport cimport BATCH, MsgBuf, Transport, addr_parse

import os

import numpy as np

cimport numpy as cnp

cnp.import_array()

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int nanosleep(const timespec *req, timespec *rem)
    int CLOCK_MONOTONIC

cdef extern from "infiniband/verbs.h" nogil:
    cdef struct ibv_context:
        pass
    cdef struct ibv_pd:
        ibv_context *context
    cdef struct ibv_comp_channel:
        ibv_context *context
        int fd
    cdef struct ibv_cq:
        ibv_context *context
        ibv_comp_channel *channel
        int cqe
    cdef struct ibv_ah:
        ibv_context *context
        ibv_pd *pd
    cdef enum ibv_qp_type:
        IBV_QPT_RC
        IBV_QPT_UD
    cdef struct ibv_qp:
        ibv_context *context
        ibv_pd *pd
        ibv_cq *send_cq
        ibv_cq *recv_cq
        uint32_t qp_num
        ibv_qp_type qp_type
    cdef struct ibv_sge:
        uint64_t addr
        uint32_t length
        uint32_t lkey
    cdef struct ibv_recv_wr:
        uint64_t wr_id
        ibv_recv_wr *next
        ibv_sge *sg_list
        int num_sge
    # The UD address lives in an anonymous union inside ibv_send_wr; only member access is
    # generated, so these helper type names never reach the C compiler.
    ctypedef struct _ibv_ud_fields:
        ibv_ah *ah
        uint32_t remote_qpn
        uint32_t remote_qkey
    ctypedef union _ibv_wr_union:
        _ibv_ud_fields ud
    cdef enum ibv_wr_opcode:
        IBV_WR_SEND
    cdef enum ibv_send_flags:
        IBV_SEND_SIGNALED
        IBV_SEND_INLINE
    cdef struct ibv_send_wr:
        uint64_t wr_id
        ibv_send_wr *next
        ibv_sge *sg_list
        int num_sge
        ibv_wr_opcode opcode
        unsigned int send_flags
        _ibv_wr_union wr
    cdef enum ibv_wc_status:
        IBV_WC_SUCCESS
    cdef enum ibv_wc_flags:
        IBV_WC_GRH
    cdef struct ibv_wc:
        uint64_t wr_id
        ibv_wc_status status
        uint32_t byte_len
        uint32_t qp_num
        uint32_t src_qp
        unsigned int wc_flags
    cdef union ibv_gid:
        uint8_t raw[16]
    cdef struct ibv_global_route:
        ibv_gid dgid
        uint32_t flow_label
        uint8_t sgid_index
        uint8_t hop_limit
        uint8_t traffic_class
    cdef struct ibv_ah_attr:
        ibv_global_route grh
        uint16_t dlid
        uint8_t sl
        uint8_t src_path_bits
        uint8_t static_rate
        uint8_t is_global
        uint8_t port_num
    ibv_ah *ibv_create_ah(ibv_pd *pd, ibv_ah_attr *attr)
    int ibv_destroy_ah(ibv_ah *ah)
    int ibv_req_notify_cq(ibv_cq *cq, int solicited_only)
    int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context)
    void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents)
    int ibv_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc)
    int ibv_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr)
    int ibv_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
    const char *ibv_wc_status_str(ibv_wc_status status)

cdef extern from *:
    """
    /* The verbs pointer pyverbs keeps in the first field after PyverbsCM. */
    static inline void *malcolm_pyverbs_ptr(PyObject *o, Py_ssize_t off) {
        return *(void **)((char *)o + off);
    }
    """
    void *malcolm_pyverbs_ptr(PyObject *o, Py_ssize_t off)

# Bytes a UD receive buffer reserves for the GRH (RoCE v2 over IPv4 puts the IPv4 header in
# its last 20 bytes).
cdef enum:
    GRH = 40
    WC_BATCH = 64
    MAX_BURST = 256

GRH_BYTES = GRH
"""Bytes at the start of every UD receive slot that hold the GRH, not payload."""

cdef inline int64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef Py_ssize_t _ptr_offset() except -1:
    from pyverbs.base import PyverbsCM
    return PyverbsCM.__basicsize__


cdef void *_pyverbs_ptr(obj, str cls_name) except NULL:
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


def _layout_error(what):
    return RuntimeError(
        f"pyverbs object layout not recognised ({what}); malcolm.net._verbs reads the verbs "
        "pointer from the first field after pyverbs.base.PyverbsCM (pyverbs 28-50). "
        "Use Debian's python3-pyverbs 44 or update malcolm/net/_verbs.pyx.")


cdef struct Peer:
    ibv_ah *ah
    int owned_ah    # made here with ibv_create_ah (else a pyverbs AH owns it)
    uint32_t qpn
    uint32_t qkey
    uint8_t gid[16]
    int v4          # IPv4-mapped GID: RoCE v2 over IPv4 puts the source address at GRH+32
    NetAddr logical  # the peer's transport address (its control socket); zero when none


cdef enum:
    CTL_LEN = 32
    INTRO_CAP = 256
    MAX_PEERS = 1 << 16          # anyone can introduce itself: bound the table


cdef struct Intro:
    NetAddr frm
    uint8_t msg[CTL_LEN]


cdef struct UDMsg:
    const uint8_t *data
    uint32_t length
    int32_t peer


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

    cdef ibv_qp *qp
    cdef ibv_pd *pd
    cdef ibv_cq *scq
    cdef ibv_cq *rcq
    cdef uint8_t *base
    cdef uint32_t lkey
    cdef readonly int n_recv, n_send, payload, max_inline, signal_every, repost_batch
    cdef int port_num, sgid_index
    cdef Py_ssize_t rslot
    cdef ibv_recv_wr *rwr
    cdef ibv_sge *rsge
    cdef int32_t *repost
    cdef int n_repost
    cdef int posted_recv
    cdef ibv_send_wr *swr
    cdef ibv_sge *ssge
    cdef uint64_t send_head
    cdef uint64_t send_tail
    cdef int staged_first, staged_last, n_staged
    cdef ibv_wc wcs[WC_BATCH]
    # Completions polled while getting ready to sleep, handed out by the next poll.
    cdef ibv_wc stash[WC_BATCH]
    cdef int n_stash
    cdef Peer *peers
    cdef int n_peers, cap_peers
    # Open-addressing hash tables of peer indices (-1 empty): by transport address, for
    # sends, and by QP number, for receives. Peers are never removed; an entry left behind
    # by a peer's old QP number is skipped (the peer's qpn no longer matches) and dropped at
    # the next rebuild.
    cdef int32_t *ltab
    cdef int32_t *qtab
    cdef uint32_t tmask
    cdef int t_used
    # Introductions (GID, QP number, Q_Key, LID of a transport address) that the transport's
    # address thread receives; only the polling thread turns them into peers.
    cdef Intro *intros
    cdef uint64_t ihead, itail
    cdef object keep
    # Counters: nothing is dropped without being counted.
    cdef readonly uint64_t sent, received, recv_errors, send_errors, unknown_src, send_full
    cdef readonly uint64_t truncated, recv_batches, reposts, ah_failed

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
        cdef ibv_qp *q = <ibv_qp *>_pyverbs_ptr(qp, "QP")
        cdef ibv_cq *s = <ibv_cq *>_pyverbs_ptr(send_cq, "CQ")
        cdef ibv_cq *r = <ibv_cq *>_pyverbs_ptr(recv_cq, "CQ")
        # Check each pointer against what pyverbs reports, so a layout change cannot go
        # unnoticed.
        if q.qp_num != qp.qp_num or <int>q.qp_type != <int>qp.qp_type:
            raise _layout_error("QP number or type differs")
        if q.qp_type != IBV_QPT_UD:
            raise ValueError("UDQueue needs a UD queue pair")
        if s.cqe != send_cq.cqe or r.cqe != recv_cq.cqe:
            raise _layout_error("CQ size differs")
        if q.send_cq != s or q.recv_cq != r or s.context != q.context:
            raise ValueError("send_cq and recv_cq must be the QP's own completion queues")
        cdef ibv_pd *p = NULL
        if pd is not None:
            p = <ibv_pd *>_pyverbs_ptr(pd, "PD")
            if p != q.pd:
                raise _layout_error("PD pointer is not the QP's PD")
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
        if _repost(self, 1) != 0:
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
        cdef ibv_ah *a = <ibv_ah *>_pyverbs_ptr(ah, "AH")
        if a.context != self.qp.context:
            raise _layout_error("AH context differs from the QP's")
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
        cdef int64_t deadline = _now_ns() + <int64_t>(timeout * 1e9)
        n = self.recv_into(out, lens, peers)
        while n == 0 and _now_ns() < deadline:
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


cdef extern from *:
    """
    static inline uint64_t mcv_load64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void mcv_store64(uint64_t *p, uint64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }
    """
    uint64_t mcv_load64(uint64_t *p) nogil
    void mcv_store64(uint64_t *p, uint64_t v) nogil


cdef inline uint32_t _ld32be(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef bint uq_push_intro(UDQueue q, const NetAddr *frm, const uint8_t *msg) noexcept nogil:
    """Queue a checked introduction for the polling thread (single producer). False if full."""
    cdef uint64_t h = q.ihead
    if h - mcv_load64(&q.itail) >= INTRO_CAP:
        return False
    q.intros[h % INTRO_CAP].frm = frm[0]
    memcpy(q.intros[h % INTRO_CAP].msg, msg, CTL_LEN)
    mcv_store64(&q.ihead, h + 1)
    return True


cdef int uq_drain_intros(UDQueue q) noexcept nogil:
    """Turn queued introductions into peers (polling thread only); returns how many."""
    cdef uint64_t t = q.itail, h = mcv_load64(&q.ihead)
    cdef int n = 0
    cdef Intro *it
    while t < h:
        it = &q.intros[t % INTRO_CAP]
        if uq_set_peer(q, &it.frm, &it.msg[16], _ld32be(&it.msg[8]), _ld32be(&it.msg[12]),
                       (<uint16_t>it.msg[6] << 8) | it.msg[7]) >= 0:
            n += 1
        t += 1
    mcv_store64(&q.itail, t)
    return n


cdef int _repost(UDQueue q, bint force) noexcept nogil:
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
    _repost(q, 0)
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
            _repost(q, 1)
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
        _repost(q, 1)
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


def pingpong(UDQueue a, int a_to_b, UDQueue b, int b_to_a, int iters, int size,
             double timeout=1.0):
    """Round trips a -> b -> a in one thread, without the GIL.

    Parameters
    ----------
    a, b : UDQueue
        Two queues; ``a_to_b`` is b's peer index on a and ``b_to_a`` is a's on b.
    iters, size : int
        Number of round trips and message size in bytes.
    timeout : float
        Seconds to wait for any single message before counting it lost.

    Returns
    -------
    rtt_ns : ndarray of int64
        Round-trip time of each completed round trip.
    lost : int
        Round trips that timed out (UD does not retransmit).
    """
    if size < 8 or size > a.payload or size > b.payload:
        raise ValueError(f"size must be in [8, {min(a.payload, b.payload)}]")
    rtt = np.zeros(iters, np.int64)
    cdef int64_t[::1] r = rtt
    cdef uint8_t[::1] msg = np.zeros(size, np.uint8)
    cdef UDMsg got[16]
    cdef int i, n, done = 0, lost = 0, failed = 0
    cdef int64_t t0, limit = <int64_t>(timeout * 1e9)
    cdef uint64_t seq
    with nogil:
        for i in range(iters):
            seq = <uint64_t>i
            memcpy(&msg[0], &seq, 8)
            t0 = _now_ns()
            if uq_send(a, a_to_b, &msg[0], size) != 1 or uq_flush(a) != 0:
                failed = 1
                break
            # b echoes what it gets.
            n = 0
            while n == 0 and _now_ns() - t0 < limit:
                n = uq_poll_recv(b, got, 16)
            if n <= 0:
                lost += 1
                continue
            if uq_send(b, b_to_a, got[0].data, got[0].length) != 1 or uq_flush(b) != 0:
                failed = 1
                break
            n = 0
            while n == 0 and _now_ns() - t0 < limit:
                n = uq_poll_recv(a, got, 16)
            if n <= 0 or memcmp(got[0].data, &seq, 8) != 0:
                lost += 1
                continue
            r[done] = _now_ns() - t0
            done += 1
            if i % 8 == 7:
                uq_reap(a)
                uq_reap(b)
    if failed:
        raise OSError("posting a send failed during the ping-pong")
    return rtt[:done], lost


# ------------------------------------------------------------------ the verbs transport

cdef extern from *:
    """
    #include "net/_netc.h"
    #include <errno.h>
    #include <fcntl.h>
    #include <poll.h>
    #include <unistd.h>
    #include <sys/socket.h>
    #include <netinet/in.h>

    /* Control datagrams carry transport addresses in the udp form (the wire's mc_addr). */
    static int mcv_recvfrom(int fd, uint8_t *buf, int cap, mc_addr *from) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        ssize_t n = recvfrom(fd, buf, (size_t)cap, MSG_DONTWAIT, (struct sockaddr *)&ss, &sl);
        if (n < 0) return -1;
        memset(from, 0, sizeof(*from));
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *s = (const struct sockaddr_in *)&ss;
            from->family = AF_INET; from->port = ntohs(s->sin_port);
            memcpy(from->addr, &s->sin_addr, 4);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&ss;
            from->family = AF_INET6; from->port = ntohs(s->sin6_port);
            memcpy(from->addr, &s->sin6_addr, 16);
        } else {
            return -2;
        }
        return (int)n;
    }

    static int mcv_sendto(int fd, const uint8_t *buf, int len, const mc_addr *to) {
        struct sockaddr_storage ss;
        socklen_t sl;
        memset(&ss, 0, sizeof(ss));
        if (to->family == AF_INET) {
            struct sockaddr_in *s = (struct sockaddr_in *)&ss;
            s->sin_family = AF_INET; s->sin_port = htons(to->port);
            memcpy(&s->sin_addr, to->addr, 4); sl = sizeof(*s);
        } else if (to->family == AF_INET6) {
            struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
            s->sin6_family = AF_INET6; s->sin6_port = htons(to->port);
            memcpy(&s->sin6_addr, to->addr, 16); sl = sizeof(*s);
        } else {
            return -1;
        }
        return (int)sendto(fd, buf, (size_t)len, MSG_DONTWAIT, (struct sockaddr *)&ss, sl);
    }

    /* Block until one of the fds is readable or the timeout passes. Bit i of the result is
       set when fds[i] is readable. */
    static int mcv_wait3(int a, int b, int c, int64_t timeout_ns) {
        struct pollfd p[3] = {{a, POLLIN, 0}, {b, POLLIN, 0}, {c, POLLIN, 0}};
        struct timespec ts;
        if (timeout_ns < 0) timeout_ns = 0;
        ts.tv_sec = timeout_ns / 1000000000; ts.tv_nsec = timeout_ns % 1000000000;
        if (ppoll(p, 3, &ts, NULL) <= 0) return 0;
        return ((p[0].revents != 0) << 0) | ((p[1].revents != 0) << 1) |
               ((p[2].revents != 0) << 2);
    }

    static void mcv_drain_efd(int fd) { uint64_t v; ssize_t r = read(fd, &v, 8); (void)r; }
    static void mcv_ring_efd(int fd) { uint64_t v = 1; ssize_t r = write(fd, &v, 8); (void)r; }
    static int mcv_set_nonblock(int fd) {
        int fl = fcntl(fd, F_GETFL);
        return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
    static inline void mcv_store(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline int mcv_load(int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    """
    int mcv_recvfrom(int fd, uint8_t *buf, int cap, NetAddr *frm) nogil
    int mcv_sendto(int fd, const uint8_t *buf, int len, const NetAddr *to) nogil
    int mcv_wait3(int a, int b, int c, int64_t timeout_ns) nogil
    void mcv_drain_efd(int fd) nogil
    void mcv_ring_efd(int fd) nogil
    int mcv_set_nonblock(int fd) nogil
    void mcv_store(int *p, int v) nogil
    int mcv_load(int *p) nogil


cdef enum:
    CTL_QUERY = 1
    CTL_REPLY = 2
    MAX_PENDING = 256            # destinations being resolved at once
    MAX_PARKED = 256             # messages held while their destination resolves
    MAX_FAILED = 64              # destinations that did not answer (no more blocking waits)
    RESOLVE_RETRY_NS = 20_000_000
    RESOLVE_GIVE_UP_NS = 2_000_000_000
    RESOLVE_SYNC_NS = 500_000_000       # first contact: wait this long for the answer
    RESOLVE_SYNC_RESEND_NS = 10_000_000


ctypedef struct Pending:
    NetAddr dst
    int64_t first_ns
    int64_t last_ns


ctypedef struct Parked:
    NetAddr dst
    uint32_t len
    uint8_t *data


cdef inline void _st32be(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v


cdef class VerbsTransport(Transport):
    """The ``verbs`` transport: one UD queue pair per endpoint (see docs/rdma.md).

    Its address is ``"host:port"`` like udp's: ``host`` is an IP address of the RDMA
    device's network interface (RoCE) or of its IPoIB interface, ``port`` a UDP port where a
    small thread of the endpoint answers address queries. The first message to a new
    destination sends it a 32-byte query (GID, QP number, Q_Key, LID; the destination learns
    ours from it) and waits up to 0.5 s for the answer (microseconds on a real network);
    after that every message goes over the queue pair. A destination that does not answer
    in time has its messages held (at most 256) while the query is retried for 2 s, then
    they are counted as failed. Messages from queue pairs that never introduced themselves
    are counted (``unknown_src``) and dropped.

    Parameters
    ----------
    address : str or tuple, optional
        Where to listen; default: the first IPv4 address in the device's GID table, port 0.
    device : str, optional
        RDMA device; default: the one whose GID table holds ``host``.
    port : int
        Port of the RDMA device.
    n_recv, n_send : int
        Registered receive and send slots.
    max_inline : int
        Inline sends up to this many bytes, when the device allows it.
    """

    cdef UDQueue q
    cdef object ep
    cdef object sock
    cdef object thread
    cdef int ctl_fd, efd, stop_efd, chan_fd
    cdef ibv_comp_channel *chan
    cdef int sleeping, stopping
    cdef uint8_t ctl_query[CTL_LEN]
    cdef uint8_t ctl_reply[CTL_LEN]
    cdef Pending *pend
    cdef int n_pend
    cdef Parked *park
    cdef uint8_t *park_mem
    cdef int n_park
    cdef NetAddr failed[MAX_FAILED]
    cdef int n_failed
    cdef uint32_t polls
    cdef UDMsg msgs[BATCH]
    cdef readonly uint64_t ctl_bad, ctl_queries, ctl_answers, intro_full, resolve_failed
    cdef readonly uint64_t parked

    def __init__(self, address=None, device=None, int port=1, int n_recv=1024,
                 int n_send=512, int max_inline=64):
        import ipaddress
        import socket
        import threading

        from malcolm.net import verbs as V

        self.ctl_fd = self.efd = self.stop_efd = self.chan_fd = -1
        self.kind = "verbs"
        host, ctl_port = V.split_address(address)
        gid = V.host_gid(host) if host is not None else None
        device, gid_index, gid = V.find_device_for_gid(gid, device, port)
        if host is None:
            if gid[:12] != bytes(10) + b"\xff\xff":
                raise V.VerbsUnavailable(
                    "the RDMA device has no IPv4 GID to listen on; give an address")
            host = str(ipaddress.IPv4Address(gid[12:]))
        self.pend = <Pending *>calloc(MAX_PENDING, sizeof(Pending))
        self.park = <Parked *>calloc(MAX_PARKED, sizeof(Parked))
        if self.pend == NULL or self.park == NULL:
            raise MemoryError()
        ep = V.Endpoint(device, port, n_recv=n_recv, n_send=n_send, payload=MAX_MSG,
                        max_inline=max_inline, gid_index=gid_index, channel=True)
        self.ep = ep
        self.q = ep.queue
        try:
            self._setup(host, ctl_port)
        except BaseException:
            ep.close()
            if self.sock is not None:
                self.sock.close()
            raise
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name="malcolm-verbs-addr",
                                       daemon=True)
        self.thread.start()

    def _setup(self, host, int ctl_port):
        import ipaddress
        import socket
        ep = self.ep
        cdef ibv_comp_channel *ch = <ibv_comp_channel *>_pyverbs_ptr(ep.channel, "CompChannel")
        if self.q.rcq.channel != ch or ch.context != self.q.qp.context:
            raise _layout_error("completion channel differs from the receive CQ's")
        self.chan = ch
        self.chan_fd = ch.fd
        if mcv_set_nonblock(self.chan_fd) < 0:
            raise OSError("cannot make the completion channel nonblocking")
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            self.sock.bind((host, ctl_port))
        except OSError as exc:
            raise OSError(exc.errno, f"verbs: cannot bind the address socket at "
                                     f"{host}:{ctl_port}: {exc.strerror}") from None
        self.sock.setblocking(False)
        self.ctl_fd = self.sock.fileno()
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.stop_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        actual = self.sock.getsockname()
        raw = ipaddress.ip_address(actual[0]).packed
        memset(&self.me, 0, sizeof(NetAddr))
        self.me.family = fam
        self.me.port = actual[1]
        memcpy(self.me.addr, <const char *>raw, len(raw))
        me = ep.address
        cdef uint8_t *m = self.ctl_query
        memset(m, 0, CTL_LEN)
        memcpy(m, b"MCV1", 4)
        m[4] = CTL_QUERY
        m[6] = (ep.lid >> 8) & 0xff
        m[7] = ep.lid & 0xff
        _st32be(&m[8], me.qpn)
        _st32be(&m[12], me.qkey)
        memcpy(&m[16], <const char *>me.gid, 16)
        memcpy(self.ctl_reply, self.ctl_query, CTL_LEN)
        self.ctl_reply[4] = CTL_REPLY
        self.park_mem = <uint8_t *>calloc(MAX_PARKED, self.q.payload)
        if self.park_mem == NULL:
            raise MemoryError()
        cdef int i
        for i in range(MAX_PARKED):
            self.park[i].data = self.park_mem + <size_t>i * self.q.payload
        for i in range(BATCH):
            self.rx[i].cap = self.q.payload
            self.tx[i].cap = self.q.payload

    def __dealloc__(self):
        free(self.pend)
        free(self.park)
        free(self.park_mem)
        if self.efd >= 0:
            os.close(self.efd)
        if self.stop_efd >= 0:
            os.close(self.stop_efd)

    def close(self):
        """Stop the address thread, destroy the queue pair, close the socket (idempotent)."""
        if self.closed:
            return
        self.closed = True
        mcv_store(&self.stopping, 1)
        mcv_ring_efd(self.stop_efd)
        self.thread.join(5.0)
        self.n_park = 0
        self.n_pend = 0
        self.q.close()
        self.ep.close()
        self.sock.close()
        self.ctl_fd = -1
        self.chan = NULL

    @property
    def endpoint(self):
        """The :class:`malcolm.net.verbs.Endpoint` (pyverbs objects) underneath."""
        return self.ep

    @property
    def max_msg(self):
        """Largest message this endpoint carries: the path MTU (4096 with jumbo frames)."""
        return self.q.payload

    def stats(self):
        """Counters of the transport and its queue, as a dict."""
        d = self.q.stats()
        d.update(n_sent=self.n_sent, n_recv=self.n_recv, n_send_failed=self.n_send_failed,
                 ctl_bad=self.ctl_bad, ctl_queries=self.ctl_queries,
                 ctl_answers=self.ctl_answers, intro_full=self.intro_full,
                 resolve_failed=self.resolve_failed, parked=self.parked,
                 peers=self.q.n_peers)
        return d

    # -------------------------------------------------------------- address thread

    def _serve(self):
        with nogil:
            self._serve_loop()

    cdef void _serve_loop(self) noexcept nogil:
        """Answer address queries and queue every valid query or answer as an introduction.

        Runs on its own thread so that a busy or sleeping gateway never delays an answer.
        """
        cdef uint8_t buf[64]
        cdef NetAddr frm
        cdef int n
        cdef uint32_t qpn
        while not mcv_load(&self.stopping):
            mcv_wait3(self.ctl_fd, self.stop_efd, -1, 100_000_000)
            while not mcv_load(&self.stopping):
                n = mcv_recvfrom(self.ctl_fd, buf, 64, &frm)
                if n == -1:
                    break
                qpn = _ld32be(&buf[8])
                if (n != CTL_LEN or memcmp(buf, b"MCV1", 4) != 0 or buf[5] != 0
                        or (buf[4] != CTL_QUERY and buf[4] != CTL_REPLY)
                        or qpn == 0 or qpn >= (1 << 24)):
                    self.ctl_bad += 1
                    continue
                if buf[4] == CTL_QUERY:
                    self.ctl_queries += 1
                    mcv_sendto(self.ctl_fd, self.ctl_reply, CTL_LEN, &frm)
                else:
                    self.ctl_answers += 1
                if not uq_push_intro(self.q, &frm, buf):
                    self.intro_full += 1

    # -------------------------------------------------------------- address resolution

    cdef int _resolve_now(self, const NetAddr *dst) noexcept nogil:
        """First contact: query ``dst`` and wait briefly for its answer. Peer index or -1."""
        cdef int64_t t0 = _now_ns(), last = t0, now
        cdef int i
        cdef timespec ts
        ts.tv_sec = 0
        ts.tv_nsec = 20_000
        mcv_sendto(self.ctl_fd, self.ctl_query, CTL_LEN, dst)
        while True:
            uq_drain_intros(self.q)
            i = uq_find_logical(self.q, dst)
            if i >= 0:
                return i
            now = _now_ns()
            if now - t0 > RESOLVE_SYNC_NS:
                return -1
            if now - last > RESOLVE_SYNC_RESEND_NS:
                mcv_sendto(self.ctl_fd, self.ctl_query, CTL_LEN, dst)
                last = now
            nanosleep(&ts, NULL)

    cdef void _check_pending(self, int64_t now) noexcept nogil:
        """Send what waited for destinations now known; retry or give up on the others."""
        cdef int i = 0, peer
        uq_drain_intros(self.q)
        while i < self.n_pend:
            peer = uq_find_logical(self.q, &self.pend[i].dst)
            if peer >= 0 or now - self.pend[i].first_ns > RESOLVE_GIVE_UP_NS:
                if peer < 0:
                    self.resolve_failed += 1
                    # Later messages to it are resolved in the background only: a dead
                    # peer must not stall the gateway again and again.
                    if self._failed_index(&self.pend[i].dst) < 0:
                        self.failed[self.n_failed % MAX_FAILED] = self.pend[i].dst
                        self.n_failed += 1
                self._unpark(&self.pend[i].dst, peer)
                self.n_pend -= 1
                self.pend[i] = self.pend[self.n_pend]
                continue
            if now - self.pend[i].last_ns > RESOLVE_RETRY_NS:
                mcv_sendto(self.ctl_fd, self.ctl_query, CTL_LEN, &self.pend[i].dst)
                self.pend[i].last_ns = now
            i += 1

    cdef void _unpark(self, const NetAddr *dst, int peer) noexcept nogil:
        """Send (peer >= 0) or fail (peer < 0) the messages held for ``dst``, in order."""
        cdef int i, j = 0, sent = 0
        cdef Parked tmp
        for i in range(self.n_park):
            if memcmp(&self.park[i].dst, dst, sizeof(NetAddr)) != 0:
                if i != j:
                    tmp = self.park[j]
                    self.park[j] = self.park[i]
                    self.park[i] = tmp
                j += 1
                continue
            if peer >= 0 and uq_send(self.q, peer, self.park[i].data, self.park[i].len) == 1:
                sent += 1
            else:
                self.n_send_failed += 1
        self.n_park = j
        if sent:
            self.n_sent += sent
            uq_flush(self.q)

    cdef int _failed_index(self, const NetAddr *dst) noexcept nogil:
        cdef int i
        for i in range(min(self.n_failed, MAX_FAILED)):
            if memcmp(&self.failed[i], dst, sizeof(NetAddr)) == 0:
                return i
        return -1

    cdef int _pending_index(self, const NetAddr *dst) noexcept nogil:
        cdef int i
        for i in range(self.n_pend):
            if memcmp(&self.pend[i].dst, dst, sizeof(NetAddr)) == 0:
                return i
        return -1

    cdef int _hold(self, const MsgBuf *b, int64_t now) noexcept nogil:
        """Hold a message for a destination being resolved. 0, or -1 when it cannot be."""
        if self.n_park == MAX_PARKED or b.len > <uint32_t>self.q.payload:
            return -1
        if self._pending_index(&b.peer) < 0:
            if self.n_pend == MAX_PENDING:
                return -1
            self.pend[self.n_pend].dst = b.peer
            self.pend[self.n_pend].first_ns = now
            self.pend[self.n_pend].last_ns = now
            self.n_pend += 1
            mcv_sendto(self.ctl_fd, self.ctl_query, CTL_LEN, &b.peer)
        memcpy(self.park[self.n_park].data, b.data, b.len)
        self.park[self.n_park].dst = b.peer
        self.park[self.n_park].len = b.len
        self.n_park += 1
        self.parked += 1
        return 0

    # -------------------------------------------------------------- the interface

    cdef int rx_poll(self, int max_n) noexcept nogil:
        cdef int n, i
        if self.closed:
            return 0
        if max_n > BATCH:
            max_n = BATCH
        self.polls += 1
        if self.n_pend and (self.polls & 15) == 0:
            self._check_pending(_now_ns())
        n = uq_poll_recv(self.q, self.msgs, max_n)
        if n <= 0:
            if self.q.ihead != self.q.itail:
                uq_drain_intros(self.q)
            return 0
        for i in range(n):
            self.rx[i].data = <uint8_t *>self.msgs[i].data
            self.rx[i].len = self.msgs[i].length
            self.rx[i].peer = self.q.peers[self.msgs[i].peer].logical
        self.n_recv += n
        return n

    cdef void rx_release(self, int n) noexcept nogil:
        # The slots are already on the repost list; post them now if a batch is full.
        if not self.closed:
            _repost(self.q, 0)

    cdef int tx_flush(self) noexcept nogil:
        cdef int i, peer, rc, n = self.n_tx, ok = 0
        cdef int64_t now = 0
        self.n_tx = 0
        if n == 0:
            return 0
        if self.closed:
            self.n_send_failed += n
            return 0
        for i in range(n):
            peer = uq_find_logical(self.q, &self.tx[i].peer)
            if peer < 0 and self.tx[i].peer.family != 0:
                if (self._pending_index(&self.tx[i].peer) < 0
                        and self._failed_index(&self.tx[i].peer) < 0):
                    peer = self._resolve_now(&self.tx[i].peer)
                if peer < 0:
                    if now == 0:
                        now = _now_ns()
                    if self._hold(&self.tx[i], now) != 0:
                        self.n_send_failed += 1
                    continue
            if peer < 0:
                self.n_send_failed += 1
                continue
            rc = uq_send(self.q, peer, self.tx[i].data, self.tx[i].len)
            if rc == 1:
                ok += 1
            else:
                self.n_send_failed += 1
        if uq_flush(self.q) < 0:
            self.n_send_failed += 1
        self.n_sent += ok
        return ok

    cdef void wait_prepare(self) noexcept nogil:
        mcv_store(&self.sleeping, 1)
        if not self.closed:
            ibv_req_notify_cq(self.q.rcq, 0)

    cdef void wait_idle(self, int64_t timeout_ns) noexcept nogil:
        cdef int n, ready
        cdef ibv_cq *cq
        cdef void *ctx
        if self.closed:
            mcv_store(&self.sleeping, 0)
            return
        # A completion that landed before the CQ was armed raises no event: look once more,
        # keeping what is found for the next rx_poll.
        if self.q.n_stash == 0:
            n = ibv_poll_cq(self.q.rcq, WC_BATCH, self.q.stash)
            self.q.n_stash = n if n > 0 else 0
        if self.q.n_stash > 0:
            mcv_store(&self.sleeping, 0)
            return
        if self.n_pend:
            if timeout_ns > RESOLVE_RETRY_NS:
                timeout_ns = RESOLVE_RETRY_NS
        ready = mcv_wait3(self.chan_fd, self.efd, -1, timeout_ns)
        if ready & 1:
            if ibv_get_cq_event(self.chan, &cq, &ctx) == 0:
                ibv_ack_cq_events(cq, 1)
        if ready & 2:
            mcv_drain_efd(self.efd)
        mcv_store(&self.sleeping, 0)
        if self.n_pend:
            self._check_pending(_now_ns())

    cdef void wait_cancel(self) noexcept nogil:
        mcv_store(&self.sleeping, 0)

    cdef void wake(self) noexcept nogil:
        if mcv_load(&self.sleeping) and self.efd >= 0:
            mcv_ring_efd(self.efd)


# ------------------------------------------------------------------ benchmarks (any transport)

cdef extern from *:
    """
    static inline void mcv_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #endif
    }
    """
    void mcv_relax() nogil


def transport_echo(Transport t, double seconds, long max_msgs=-1):
    """Send every message back to its sender, busy-polling without the GIL.

    Stops after ``seconds`` or ``max_msgs`` messages; returns how many were echoed. Works on
    any transport (udp and shm too, for comparisons).
    """
    if t.closed:
        raise RuntimeError("transport is closed")
    cdef int64_t deadline = _now_ns() + <int64_t>(seconds * 1e9)
    cdef long done = 0
    cdef int n, i
    cdef uint32_t spins = 0
    cdef MsgBuf *b
    with nogil:
        while max_msgs < 0 or done < max_msgs:
            n = t.rx_poll(BATCH)
            for i in range(n):
                b = t.tx_next(&t.rx[i].peer)
                memcpy(b.data, t.rx[i].data, t.rx[i].len)
                b.len = t.rx[i].len
            t.rx_release(n)
            if n:
                t.tx_flush()
                done += n
                continue
            spins += 1
            if (spins & 1023) == 0 and _now_ns() > deadline:
                break
            mcv_relax()
    return done


def transport_pingpong(Transport t, dst, int iters, int size=32, double timeout=1.0):
    """Round trips to an echoing peer (:func:`transport_echo`), busy-polling without the GIL.

    Returns ``(rtt_ns, lost)``: the round-trip time of each completed round trip, and how many
    got no answer within ``timeout`` seconds.
    """
    if size < 8 or size > MAX_MSG:
        raise ValueError(f"size must be in [8, {MAX_MSG}]")
    cdef NetAddr d
    addr_parse(t.kind, dst, &d)
    rtt = np.zeros(iters, np.int64)
    cdef int64_t[::1] r = rtt
    cdef int64_t t0, limit = <int64_t>(timeout * 1e9)
    cdef uint64_t seq, got
    cdef int i, n, k, done = 0, lost = 0
    cdef bint ok
    cdef MsgBuf *b
    with nogil:
        for i in range(iters):
            seq = <uint64_t>i + 1
            t0 = _now_ns()
            b = t.tx_next(&d)
            memset(b.data, 0, size)
            memcpy(b.data, &seq, 8)
            b.len = size
            t.tx_flush()
            ok = False
            while not ok and _now_ns() - t0 < limit:
                n = t.rx_poll(BATCH)
                for k in range(n):
                    if t.rx[k].len >= 8:
                        memcpy(&got, t.rx[k].data, 8)
                        if got == seq:
                            ok = True
                t.rx_release(n)
                if not ok:
                    mcv_relax()
            if ok:
                r[done] = _now_ns() - t0
                done += 1
            else:
                lost += 1
    return rtt[:done], lost
