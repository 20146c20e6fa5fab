"""The ``verbs`` transport: the transport interface over one UD queue pair, with the thread
that answers address queries.

pyverbs (Debian's ``python3-pyverbs``) creates and owns every verbs object
(:class:`malcolm.net.verbs.Endpoint`); :mod:`malcolm.net._ud_queue` takes their raw pointers
and moves the data without the GIL. This module adds what makes a UD queue pair a transport
like udp's: addresses ``"host:port"`` (the port of a small UDP socket that answers address
queries), the resolution of a new destination's address handle, and blocking waits on the
receive CQ's completion channel.

Readiness. The answer to an address query is the querier's licence to send: this endpoint
queues the querier's introduction for its polling thread *before* it answers, and does not
answer when that queue is full. The polling thread looks in that queue for any sender it does
not know, so the first message of a new peer always finds its introduction (issue 13 item 6).

Authentication. With the rack key (``key=``), queries and answers are 64 bytes: the
introduction, the sender's epoch, a nonce and a cookie, and a SipHash-2-4 MAC bound to both
ends (``net/_verbs_ctl.h`` has the format and the rules). Without it they are the 32-byte
introduction alone, as before, and anyone who can send a UDP datagram from a member's
address can re-point traffic meant for it (the server warns at start).
"""

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcmp, memcpy, memset

from malcolm._core cimport mc_load_relaxed, mc_now_ns
from malcolm._system cimport nanosleep, timespec
from malcolm.net._ibverbs cimport (ibv_ack_cq_events, ibv_comp_channel, ibv_cq,
                                   ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq)
from malcolm.net._ud_queue cimport (CTL_LEN, WC_BATCH, Peer, UDMsg, UDQueue, layout_error,
                                    ld32be, pyverbs_ptr, uq_drain_intros, uq_find_logical,
                                    uq_flush, uq_poll_recv, uq_push_intro, uq_repost, uq_send)
from malcolm.net._wire cimport MAX_MSG, NetAddr, wire_new_epoch
from malcolm.net.transport cimport BATCH, MsgBuf, Transport, addr_eq, addr_parse

import os

cdef extern from *:
    """
    #include "net/_netc.h"
    #include "net/_sockaddr.h"
    #include <errno.h>
    #include <fcntl.h>
    #include <poll.h>
    #include <unistd.h>

    /* Control datagrams carry transport addresses in the udp form (the wire's mc_addr, with
       the IPv6 scope id: the conversion is udp's own, net/_sockaddr.h). */
    static int mcv_recvfrom(int fd, uint8_t *buf, int cap, mc_addr *from) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        ssize_t n = recvfrom(fd, buf, (size_t)cap, MSG_DONTWAIT, (struct sockaddr *)&ss, &sl);
        if (n < 0) return -1;
        if (mc_sa_to_addr(&ss, from) != 0) return -2;
        return (int)n;
    }

    static int mcv_sendto(int fd, const uint8_t *buf, int len, const mc_addr *to) {
        struct sockaddr_storage ss;
        socklen_t sl = mc_addr_to_sa(to, &ss);
        if (!sl) return -1;
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


cdef extern from "net/_verbs_ctl.h" nogil:
    enum:
        MCV_AUTH_LEN
        MCV_BAD
        MCV_BAD_MAC
        MCV_REPLAY
        MCV_UNSOLICITED
    ctypedef struct mcv_rec:
        pass
    ctypedef struct mcv_auth:
        mcv_rec *recs
    int mcv_init(mcv_auth *au, const uint8_t *key, const uint8_t *local, uint64_t epoch)
    void mcv_query(mcv_auth *au, const uint8_t *tmpl, const NetAddr *me, const NetAddr *dst,
                   int64_t now, uint8_t *out)
    void mcv_reply(const mcv_auth *au, const uint8_t *tmpl, const uint8_t *q,
                   const NetAddr *me, const NetAddr *dst, uint8_t *out)
    int mcv_check(const mcv_auth *au, const uint8_t *m, int n, const NetAddr *frm,
                  const NetAddr *me, int64_t now)
    void mcv_commit(mcv_auth *au, const uint8_t *m, const NetAddr *frm, int64_t now)


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
    # A known peer we send to but have not heard from for this long is asked for its address
    # again (at most this often): if it restarted on the same address, its queue pair is new
    # and the answer carries it (UD to a queue pair that is gone is dropped without a trace).
    REQUERY_NS = 20_000_000


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

    With the rack key, every query and answer carries a MAC bound to both ends, a query a
    fresh nonce, the sender's epoch and a sequence, an answer the nonce of the query it
    answers: forged, replayed and unsolicited ones are dropped and counted
    (``ctl_bad_mac``, ``ctl_replay``, ``ctl_unsolicited``), so nobody without the key can
    re-point this endpoint's traffic to another queue pair (docs/rdma.md).

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
    key : bytes, optional
        The rack's 16-byte MAC key (:func:`malcolm.runtime.config.rack_key`): address
        queries and answers are authenticated with it. Every endpoint of a rack (servers
        and clients) needs the same key, or none (then anyone who can send a UDP datagram
        from a member's address can re-point traffic meant for it).
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
    cdef readonly uint64_t parked, requeries, announced
    cdef readonly uint64_t ctl_bad_mac, ctl_replay, ctl_unsolicited
    cdef readonly bint authenticated
    cdef mcv_auth auth

    def __init__(self, address=None, device=None, int port=1, int n_recv=1024,
                 int n_send=512, int max_inline=64, key=None):
        import ipaddress
        import socket
        import threading

        from malcolm.net import verbs

        self.ctl_fd = self.efd = self.stop_efd = self.chan_fd = -1
        self.kind = "verbs"
        if key is not None:
            key = bytes(key)
            if len(key) != 16:
                raise ValueError(f"verbs: the rack key must be 16 bytes (rack_key()), "
                                 f"not {len(key)}")
            local = os.urandom(16)
            if mcv_init(&self.auth, <const uint8_t *><const char *>key,
                        <const uint8_t *><const char *>local, wire_new_epoch()) != 0:
                raise MemoryError()
            self.authenticated = True
        host, ctl_port = verbs.split_address(address)
        gid = verbs.host_gid(host) if host is not None else None
        device, gid_index, gid = verbs.find_device_for_gid(gid, device, port)
        if host is None:
            if gid[:12] != bytes(10) + b"\xff\xff":
                raise verbs.VerbsUnavailable(
                    "the RDMA device has no IPv4 GID to listen on; give an address")
            host = str(ipaddress.IPv4Address(gid[12:]))
        self.pend = <Pending *>calloc(MAX_PENDING, sizeof(Pending))
        self.park = <Parked *>calloc(MAX_PARKED, sizeof(Parked))
        if self.pend == NULL or self.park == NULL:
            raise MemoryError()
        ep = verbs.Endpoint(device, port, n_recv=n_recv, n_send=n_send, payload=MAX_MSG,
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
        cdef ibv_comp_channel *ch = <ibv_comp_channel *>pyverbs_ptr(ep.channel, "CompChannel")
        if self.q.rcq.channel != ch or ch.context != self.q.qp.context:
            raise layout_error("completion channel differs from the receive CQ's")
        self.chan = ch
        self.chan_fd = ch.fd
        if mcv_set_nonblock(self.chan_fd) < 0:
            raise OSError("cannot make the completion channel nonblocking")
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            where = (host, ctl_port)
            if fam == socket.AF_INET6:
                # A link-local address binds only with its scope id ("fe80::1%eth0"), which
                # only the 4-tuple form carries.
                where = socket.getaddrinfo(host, ctl_port, fam, socket.SOCK_DGRAM, 0,
                                           socket.AI_NUMERICHOST)[0][4]
            self.sock.bind(where)
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
        if fam == socket.AF_INET6:
            self.me.extra = actual[3]       # the scope id of a link-local address
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
        free(self.auth.recs)
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
                 requeries=self.requeries, announced=self.announced, peers=self.q.n_peers,
                 authenticated=bool(self.authenticated), ctl_bad_mac=self.ctl_bad_mac,
                 ctl_replay=self.ctl_replay, ctl_unsolicited=self.ctl_unsolicited)
        return d

    # -------------------------------------------------------------- address thread

    def _serve(self):
        with nogil:
            self._serve_loop()

    cdef void _serve_loop(self) noexcept nogil:
        """Answer address queries and queue every valid query or answer as an introduction.

        Runs on its own thread so that a busy or sleeping gateway never delays an answer.
        """
        cdef uint8_t buf[128]
        cdef uint8_t out[MCV_AUTH_LEN]
        cdef NetAddr frm
        cdef int n, v = 0
        cdef uint32_t qpn
        cdef int64_t now = 0
        while not mcv_load(&self.stopping):
            mcv_wait3(self.ctl_fd, self.stop_efd, -1, 100_000_000)
            while not mcv_load(&self.stopping):
                n = mcv_recvfrom(self.ctl_fd, buf, 128, &frm)
                if n == -1:
                    break
                qpn = ld32be(&buf[8])
                if (n < CTL_LEN or memcmp(buf, b"MCV1", 4) != 0
                        or (buf[4] != CTL_QUERY and buf[4] != CTL_REPLY)
                        or qpn == 0 or qpn >= (1 << 24)):
                    self.ctl_bad += 1
                    continue
                if self.authenticated:
                    # The MAC first: nothing from outside the rack reaches the records.
                    now = mc_now_ns()
                    v = mcv_check(&self.auth, buf, n, &frm, &self.me, now)
                    if v < 0:
                        if v == MCV_BAD_MAC:
                            self.ctl_bad_mac += 1
                        elif v == MCV_REPLAY:
                            self.ctl_replay += 1
                        elif v == MCV_UNSOLICITED:
                            self.ctl_unsolicited += 1
                        else:
                            self.ctl_bad += 1
                        continue
                elif n != CTL_LEN or buf[5] != 0:
                    self.ctl_bad += 1
                    continue
                # Queue the introduction BEFORE answering: the answer tells the sender that
                # it may send now, and the polling thread looks for a sender it does not know
                # in this queue. Answering first let a fast sender's first batch reach the
                # polling thread before its introduction did, and the whole batch was
                # dropped as unknown_src (test_between_processes[verbs], 20 of 200).
                if not uq_push_intro(self.q, &frm, buf):
                    # Not ready for it: no answer, so the sender keeps its messages and asks
                    # again (every 10-20 ms) until the polling thread has made room. Not
                    # recorded either: the same query may come again.
                    self.intro_full += 1
                    continue
                if self.authenticated:
                    mcv_commit(&self.auth, buf, &frm, now)
                if buf[4] == CTL_QUERY:
                    self.ctl_queries += 1
                    if self.authenticated:
                        mcv_reply(&self.auth, self.ctl_reply, buf, &self.me, &frm, out)
                        mcv_sendto(self.ctl_fd, out, MCV_AUTH_LEN, &frm)
                    else:
                        mcv_sendto(self.ctl_fd, self.ctl_reply, CTL_LEN, &frm)
                else:
                    self.ctl_answers += 1
                # A sleeping polling thread makes the address handle now, before the
                # sender's first message arrives (and frees the queue's room).
                if mcv_load(&self.sleeping):
                    mcv_ring_efd(self.efd)

    cdef void _query(self, const NetAddr *dst) noexcept nogil:
        """Send ``dst`` an address query (polling thread): with the key, a fresh one each
        time (its own nonce and sequence), else the fixed 32 bytes."""
        cdef uint8_t m[MCV_AUTH_LEN]
        if self.authenticated:
            mcv_query(&self.auth, self.ctl_query, &self.me, dst, mc_now_ns(), m)
            mcv_sendto(self.ctl_fd, m, MCV_AUTH_LEN, dst)
        else:
            mcv_sendto(self.ctl_fd, self.ctl_query, CTL_LEN, dst)

    # -------------------------------------------------------------- address resolution

    cdef int _resolve_now(self, const NetAddr *dst) noexcept nogil:
        """First contact: query ``dst`` and wait briefly for its answer. Peer index or -1."""
        cdef int64_t t0 = mc_now_ns(), last = t0, now
        cdef int i
        cdef timespec ts
        ts.tv_sec = 0
        ts.tv_nsec = 20_000
        self._query(dst)
        while True:
            uq_drain_intros(self.q)
            i = uq_find_logical(self.q, dst)
            if i >= 0:
                return i
            now = mc_now_ns()
            if now - t0 > RESOLVE_SYNC_NS:
                return -1
            if now - last > RESOLVE_SYNC_RESEND_NS:
                self._query(dst)
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
                self._query(&self.pend[i].dst)
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
            self._query(&b.peer)
        memcpy(self.park[self.n_park].data, b.data, b.len)
        self.park[self.n_park].dst = b.peer
        self.park[self.n_park].len = b.len
        self.n_park += 1
        self.parked += 1
        return 0

    def announce(self, addresses):
        """Introduce this endpoint to ``addresses`` now, before the first message to them.

        A server calls it at start with its rack's other members: a peer that knew this
        address at an older queue pair (this server restarted) takes the new one at once (its
        address thread queues the introduction, its polling thread applies it before its next
        send), instead of sending into the old one until it re-queries. Destinations not yet
        known are resolved in the background, so the first message to them waits for no
        answer. Call it from the thread that polls (or before that thread starts).
        """
        cdef NetAddr a
        cdef int64_t now = mc_now_ns()
        if self.closed:
            raise RuntimeError("transport is closed")
        for dst in addresses:
            addr_parse(self.kind, dst, &a)
            if addr_eq(&a, &self.me):
                continue
            self.announced += 1
            self._query(&a)
            if (uq_find_logical(self.q, &a) < 0 and self._pending_index(&a) < 0
                    and self.n_pend < MAX_PENDING):
                self.pend[self.n_pend].dst = a
                self.pend[self.n_pend].first_ns = now
                self.pend[self.n_pend].last_ns = now
                self.n_pend += 1

    # -------------------------------------------------------------- the interface

    cdef int rx_poll(self, int max_n) noexcept nogil:
        cdef int n, i
        if self.closed:
            return 0
        if max_n > BATCH:
            max_n = BATCH
        self.polls += 1
        if self.n_pend and (self.polls & 15) == 0:
            self._check_pending(mc_now_ns())
        # New peers' introductions are turned into peers before this poll, busy or idle: a
        # gateway kept busy by known peers would otherwise leave them queued until it idled,
        # the queue would fill, and the address thread would stop answering new peers. One
        # comparison per poll when there is nothing to do.
        if mc_load_relaxed(&self.q.ihead) != self.q.itail:
            uq_drain_intros(self.q)
        n = uq_poll_recv(self.q, self.msgs, max_n)
        if n <= 0:
            return 0
        cdef int64_t now = mc_now_ns()        # once a batch: when each sender was last heard
        for i in range(n):
            self.q.peers[self.msgs[i].peer].last_rx_ns = now
            self.rx[i].data = <uint8_t *>self.msgs[i].data
            self.rx[i].len = self.msgs[i].length
            self.rx[i].peer = self.q.peers[self.msgs[i].peer].logical
        self.n_recv += n
        return n

    cdef void rx_release(self, int n) noexcept nogil:
        # The slots are already on the repost list; post them now if a batch is full.
        if not self.closed:
            uq_repost(self.q, 0)

    cdef int tx_flush(self) noexcept nogil:
        cdef int i, peer, rc, n = self.n_tx, ok = 0
        cdef int64_t now
        cdef Peer *p
        self.n_tx = 0
        if n == 0:
            return 0
        if self.closed:
            self.n_send_failed += n
            return 0
        # A peer that restarted and introduced itself (its announcement, or the answer to a
        # re-query) is sent to at its new queue pair from this flush on, not the next poll.
        if mc_load_relaxed(&self.q.ihead) != self.q.itail:
            uq_drain_intros(self.q)
        now = mc_now_ns()
        for i in range(n):
            peer = uq_find_logical(self.q, &self.tx[i].peer)
            if peer < 0 and self.tx[i].peer.family != 0:
                if (self._pending_index(&self.tx[i].peer) < 0
                        and self._failed_index(&self.tx[i].peer) < 0):
                    peer = self._resolve_now(&self.tx[i].peer)
                if peer < 0:
                    if self._hold(&self.tx[i], now) != 0:
                        self.n_send_failed += 1
                    continue
            if peer < 0:
                self.n_send_failed += 1
                continue
            p = &self.q.peers[peer]
            if now - p.last_rx_ns > REQUERY_NS and now - p.last_query_ns > REQUERY_NS:
                # Silent: it may have restarted. The message still goes to the queue pair we
                # know (it is alive and quiet, or the message is lost and its task reported
                # by its client's timeout); the answer, if the queue pair changed, moves us
                # to the new one within a round trip.
                p.last_query_ns = now
                self.requeries += 1
                self._query(&p.logical)
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
            self._check_pending(mc_now_ns())

    cdef void wait_cancel(self) noexcept nogil:
        mcv_store(&self.sleeping, 0)

    cdef void wake(self) noexcept nogil:
        if mcv_load(&self.sleeping) and self.efd >= 0:
            mcv_ring_efd(self.efd)
