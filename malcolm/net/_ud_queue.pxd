# cython: language_level=3
"""cimport API of the UD queue (:mod:`malcolm.net._ud_queue`): one unreliable-datagram queue
pair and its registered buffers, driven from ``noexcept nogil`` code.

The ``uq_*`` functions are the data path; :class:`malcolm.net._verbs.VerbsTransport` and the
verbs benchmarks (:mod:`malcolm.bench.verbs`) call them without the GIL. One thread polls and
sends on a queue; only :func:`uq_push_intro` may be called from one other thread (the
transport's address thread).
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from malcolm.net._ibverbs cimport (ibv_ah, ibv_cq, ibv_pd, ibv_qp, ibv_recv_wr, ibv_send_wr,
                                   ibv_sge, ibv_wc)
from malcolm.net._wire cimport NetAddr


cdef enum:
    # Bytes a UD receive buffer reserves for the GRH (RoCE v2 over IPv4 puts the IPv4 header
    # in its last 20 bytes).
    GRH = 40
    WC_BATCH = 64
    MAX_BURST = 256
    # An introduction: the 32-byte address message (GID, QP number, Q_Key, LID) of a peer.
    CTL_LEN = 32
    INTRO_CAP = 256
    MAX_PEERS = 1 << 16          # anyone can introduce itself: bound the table


cdef struct Peer:
    ibv_ah *ah
    int owned_ah    # made here with ibv_create_ah (else a pyverbs AH owns it)
    uint32_t qpn
    uint32_t qkey
    uint8_t gid[16]
    int v4          # IPv4-mapped GID: RoCE v2 over IPv4 puts the source address at GRH+32
    NetAddr logical  # the peer's transport address (its control socket); zero when none
    # For VerbsTransport's re-query of a silent peer (a restart on the same address leaves
    # us sending to a queue pair that is gone): when it was last heard from (a message or an
    # introduction) and last asked for its address, CLOCK_MONOTONIC ns.
    int64_t last_rx_ns
    int64_t last_query_ns


cdef struct Intro:
    NetAddr frm
    uint8_t msg[CTL_LEN]


cdef struct UDMsg:
    const uint8_t *data
    uint32_t length
    int32_t peer


cdef class UDQueue:
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

    cdef void _destroy_ahs(self) noexcept


cdef void *pyverbs_ptr(obj, str cls_name) except NULL
cdef object layout_error(str what)

cdef int uq_find_logical(UDQueue q, const NetAddr *a) noexcept nogil
cdef int uq_set_peer(UDQueue q, const NetAddr *logical, const uint8_t *gid, uint32_t qpn,
                     uint32_t qkey, uint16_t lid) noexcept nogil
cdef bint uq_push_intro(UDQueue q, const NetAddr *frm, const uint8_t *msg) noexcept nogil
cdef int uq_drain_intros(UDQueue q) noexcept nogil
cdef int uq_repost(UDQueue q, bint force) noexcept nogil
cdef int uq_poll_recv(UDQueue q, UDMsg *out, int max_msgs) noexcept nogil
cdef int uq_reap(UDQueue q) noexcept nogil
cdef int uq_send(UDQueue q, int peer, const uint8_t *data, uint32_t length) noexcept nogil
cdef int uq_flush(UDQueue q) noexcept nogil


cdef inline uint32_t ld32be(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]
