# cython: language_level=3
"""Transports behind one interface (see ``transport.pxd``): ``udp`` and ``shm``.

``open_transport(kind, address)`` opens one; asking for a kind that is not available here
raises :class:`TransportUnavailable` with the reason and the fix, and never falls back to
another kind.
"""
import ipaddress
import itertools
import math
import numbers
import os
import socket

from malcolm._units import ascii_digits
from malcolm.net import shm_reap
from malcolm.net.limits import MAX_SHM_CAPACITY     # the rack file's bound too

from libc.errno cimport errno
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcmp, memcpy, memmove, memset, strerror

from malcolm._core cimport mc_aligned_alloc, mc_cpu_relax
from malcolm._native cimport (
    mc_bell_cancel, mc_bell_prepare, mc_bell_ring, mc_bell_wait, mc_doorbell,
)
from malcolm.net._wire cimport FAM_SHM, MAX_MSG, NetAddr


cdef extern from "net/_netc.h" nogil:
    ctypedef struct mc_ring_hdr:
        uint32_t capacity
        uint32_t cell_bytes
        uint32_t alive
        int owner_pid
        mc_doorbell bell
    ctypedef struct mc_cell_hdr:
        uint64_t seq
        uint32_t len
        uint8_t src[24]
    int mc_ring_push(mc_ring_hdr* r, const uint8_t* src_addr, const uint8_t* msg,
                     uint32_t len)
    mc_cell_hdr* mc_ring_peek(mc_ring_hdr* r, uint64_t i)
    void mc_ring_release(mc_ring_hdr* r, uint64_t n)
    bint mc_ring_empty(mc_ring_hdr* r)


cdef extern from "net/_shm.h" nogil:
    mc_ring_hdr* mc_shm_create(const uint8_t* name, uint32_t capacity, uint32_t cell_bytes,
                               size_t* size_out, int* fd_out)
    mc_ring_hdr* mc_shm_attach(const uint8_t* name, size_t* size_out)
    void mc_shm_detach(mc_ring_hdr* r, size_t size)
    void mc_shm_destroy(mc_ring_hdr* r, size_t size, const uint8_t* name, int fd)
    bint mc_shm_owner_running(mc_ring_hdr* r, const uint8_t* name)
    void mc_shm_mark_stopped(mc_ring_hdr* r)
    bint mc_shm_other_ns(const mc_ring_hdr* r)


cdef extern from "net/_udp.h" nogil:
    enum: MC_BATCH
    struct mmsghdr:
        unsigned int msg_len
    ctypedef struct mc_udp:
        int fd
        mmsghdr rx[64]
        pass
    int mc_udp_open(mc_udp* u, const NetAddr* bind_to, int bufbytes, uint32_t rx_cap,
                    uint8_t* rxbuf, uint8_t* txbuf, NetAddr* actual)
    void mc_udp_close(mc_udp* u)
    int mc_udp_recv(mc_udp* u, int max_n)
    int mc_udp_send(mc_udp* u, const uint32_t* lens, const NetAddr* dsts, int n,
                    uint64_t* dropped)
    void mc_udp_prepare(mc_udp* u)
    void mc_udp_cancel(mc_udp* u)
    int mc_udp_wait(mc_udp* u, int64_t timeout_ns)
    void mc_udp_wake(mc_udp* u)
    int mc_sa_to_addr(const void* ss, NetAddr* a)


cdef extern from *:
    """
    static inline const void *mc_udp_sa(mc_udp *u, int i) { return &u->rxsa[i]; }
    """
    const void* mc_udp_sa(mc_udp* u, int i) nogil


class TransportUnavailable(RuntimeError):
    """The requested transport cannot run here; the message says why and how to fix it."""


class HostNotResolved(ValueError):
    """A udp address's host name (``host``) that does not resolve on this machine."""

    def __init__(self, message, host):
        super().__init__(message)
        self.host = host


# ---------------------------------------------------------------- addresses

cdef bint addr_eq(const NetAddr* a, const NetAddr* b) noexcept nogil:
    return memcmp(a, b, sizeof(NetAddr)) == 0


cdef int64_t _timeout_ns(double timeout) except? -1:
    """A wait of ``timeout`` s in ns: finite and >= 0 (a negative, NaN or 1e10 s one came out
    negative, which the waits read as "forever"), at most 1e9 s (the int64 ns clock)."""
    if not (math.isfinite(timeout) and timeout >= 0.0):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
    return <int64_t>(min(timeout, 1e9) * 1e9)


def split_host_port(obj, str what="udp"):
    """``(host, port)`` of ``"host:port"``, ``"[v6]:port"`` or a ``(host, port)`` pair, with the
    port checked; ``what`` names the transport in error messages. udp and verbs share it."""
    if isinstance(obj, str):
        host, sep, port = obj.rpartition(":")
        if not sep:
            raise ValueError(f"{what} address {obj!r} must be host:port")
        host = host.strip("[]")
    else:
        host, port = obj
    try:        # ASCII digits only: int() read "127.0.0.1:８０" as port 80, and "+80", " 80"
        if isinstance(port, str) and not ascii_digits(port):
            raise ValueError
        port = int(port)
    except ValueError:
        raise ValueError(f"{what} address {obj!r}: port {port!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} address {obj!r}: port out of range")
    return host, port


cdef int addr_parse(str kind, object obj, NetAddr* out) except -1:
    """Parse a Python address for transport ``kind`` into ``out``.

    udp: ``"host:port"``, ``"[v6]:port"`` or ``(host, port)``; shm: an endpoint name of at
    most 16 characters ``[A-Za-z0-9._-]``.
    """
    memset(out, 0, sizeof(NetAddr))
    if kind == "shm":
        if not isinstance(obj, str) or not 1 <= len(obj) <= 16 or not all(
                c.isascii() and (c.isalnum() or c in "._-") for c in obj):
            raise ValueError(f"shm endpoint name {obj!r} must be 1..16 characters "
                             f"of [A-Za-z0-9._-]")
        raw = obj.encode()
        out.family = FAM_SHM
        memcpy(out.addr, <const char*>raw, len(raw))
        return 0
    # verbs addresses are udp's: the IP of the RDMA interface and the port of its address
    # socket (malcolm/net/_verbs.pyx).
    if kind != "udp" and kind != "verbs":
        raise ValueError(f"no address syntax for transport {kind!r}")
    host, port = split_host_port(obj, "udp")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.getaddrinfo(
                host, None, type=socket.SOCK_DGRAM)[0][4][0])
        except (socket.gaierror, IndexError, ValueError):
            raise HostNotResolved(f"udp address {obj!r}: cannot resolve {host!r}",
                                  host) from None
    raw = ip.packed
    out.family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    out.port = port
    if ip.version == 6 and ip.scope_id:
        out.extra = _scope_index(ip.scope_id, obj)
    memcpy(out.addr, <const char*>raw, len(raw))
    return 0


def check_address(str kind, obj):
    """``obj`` as transport ``kind`` reads an address (its Python form), without opening an
    endpoint: so that a command can refuse a bad address before it starts anything.

    Raises
    ------
    ValueError
        One line naming the address and what is wrong with it.
    """
    cdef NetAddr a
    addr_parse(kind, obj, &a)
    return addr_py(&a)


def _scope_index(str scope, obj):
    """The interface index of an IPv6 scope (``fe80::1%eth0`` or ``fe80::1%2``)."""
    # ASCII digits only: isdigit() passed "８" (interface 8) and "²" (int() then failed)
    if ascii_digits(scope):
        # the wire's uint32: an OverflowError, not a line (the length first: int() refuses
        # over 4300 digits in words of its own)
        if len(scope) > 10 or int(scope) > 0xFFFFFFFF:
            raise ValueError(f"udp address {obj!r}: interface index {scope[:12]}"
                             f"{'...' if len(scope) > 12 else ''} is over 4294967295")
        return int(scope)
    try:
        return socket.if_nametoindex(scope)
    except OSError:
        raise ValueError(f"udp address {obj!r}: no network interface {scope!r}") from None


cdef object addr_py(const NetAddr* a):
    """The Python form of an address: ``(host, port)`` for udp, the name for shm."""
    if a.family == FAM_SHM:
        return bytes(a.addr[:16]).rstrip(b"\0").decode("ascii", "replace")
    if a.family == socket.AF_INET:
        return (str(ipaddress.IPv4Address(bytes(a.addr[:4]))), a.port)
    if a.family == socket.AF_INET6:
        host = str(ipaddress.IPv6Address(bytes(a.addr[:16])))
        if a.extra:         # a link-local address is only meaningful with its scope
            try:
                host += "%" + socket.if_indextoname(a.extra)
            except OSError:
                host += f"%{a.extra}"
        return (host, a.port)
    return None


def format_addr(a):
    """``"host:port"`` or the shm name, for logs."""
    if isinstance(a, tuple):
        return f"[{a[0]}]:{a[1]}" if ":" in a[0] else f"{a[0]}:{a[1]}"
    return str(a)


def addr_bytes(str kind, obj):
    """The 24-byte wire form of an address, as (family, port, extra, addr16)."""
    cdef NetAddr a
    addr_parse(kind, obj, &a)
    return (a.family, a.port, a.extra, bytes(a.addr[:16]))


def addr_from_wire(t):
    """The Python form of a wire address tuple (family, port, extra, addr16)."""
    cdef NetAddr a
    memset(&a, 0, sizeof(NetAddr))
    a.family, a.port, a.extra = t[0], t[1], t[2]
    raw = bytes(t[3])[:16]
    memcpy(a.addr, <const char*>raw, len(raw))
    return addr_py(&a)


# ---------------------------------------------------------------- the interface

cdef class Transport:
    """Abstract transport; see ``transport.pxd`` for the contract.

    The ``def`` methods (``send``, ``recv``) are conveniences for tests and Python tools;
    the runtime uses the ``cdef`` ones without the GIL.
    """

    def __cinit__(self, *args, **kwargs):
        cdef int i
        self.txmem = <uint8_t*>mc_aligned_alloc(64, <size_t>BATCH * SLOT)
        if self.txmem == NULL:
            raise MemoryError()
        for i in range(BATCH):
            self.tx[i].data = self.txmem + <size_t>i * SLOT
            self.tx[i].cap = MAX_MSG
            self.tx[i].len = 0
        self.n_tx = 0
        self.closed = True

    def __dealloc__(self):
        free(self.txmem)

    cdef int rx_poll(self, int max_n) noexcept nogil:
        return 0

    cdef void rx_release(self, int n) noexcept nogil:
        pass

    cdef MsgBuf* tx_next(self, const NetAddr* dst) noexcept nogil:
        cdef MsgBuf* b
        if self.n_tx == BATCH:
            self.tx_flush()
        b = &self.tx[self.n_tx]
        self.n_tx += 1
        b.peer = dst[0]
        b.len = 0
        return b

    cdef int tx_flush(self) noexcept nogil:
        self.n_tx = 0
        return 0

    cdef void wait_prepare(self) noexcept nogil:
        pass

    cdef void wait_idle(self, int64_t timeout_ns) noexcept nogil:
        pass

    cdef void wait_cancel(self) noexcept nogil:
        pass

    cdef void wake(self) noexcept nogil:
        pass

    cdef void local_addr(self, NetAddr* out) noexcept nogil:
        out[0] = self.me

    # ------------------------------------------------------------ Python conveniences
    @property
    def address(self):
        """This endpoint's address in Python form (udp: (host, port); shm: name)."""
        return addr_py(&self.me)

    def parse(self, obj):
        """Check an address for this transport; return its Python form."""
        return check_address(self.kind, obj)

    def send(self, dst, data):
        """Send one message now (``data``: bytes of at most MAX_MSG)."""
        self.send_many([(dst, data)])

    def send_many(self, items):
        """Send ``[(dst, data), ...]`` in batches."""
        cdef NetAddr a
        cdef MsgBuf* b
        cdef const uint8_t[::1] view
        if self.closed:
            raise RuntimeError("transport is closed")
        for dst, data in items:
            if len(data) > MAX_MSG:
                raise ValueError(f"message of {len(data)} bytes is over {MAX_MSG}")
            addr_parse(self.kind, dst, &a)
            b = self.tx_next(&a)
            view = data
            if len(data):
                memcpy(b.data, &view[0], len(data))
            b.len = len(data)
        with nogil:
            self.tx_flush()

    def recv(self, double timeout=0.0, int max_n=BATCH):
        """Return up to ``max_n`` received ``(bytes, src)`` pairs, waiting up to ``timeout`` s."""
        cdef int n, i
        cdef int64_t left_ns, t_end
        import time
        if self.closed:
            raise RuntimeError("transport is closed")
        if max_n < 1:       # a negative count reached recvmmsg as a huge one: data lost
            raise ValueError(f"max_n must be at least 1, got {max_n}")
        if max_n > BATCH:
            max_n = BATCH
        t_end = time.monotonic_ns() + _timeout_ns(timeout)
        while True:
            n = self.rx_poll(max_n)
            if n > 0:
                out = [(bytes(self.rx[i].data[:self.rx[i].len]), addr_py(&self.rx[i].peer))
                       for i in range(n)]
                self.rx_release(n)
                return out
            left_ns = t_end - time.monotonic_ns()
            if left_ns <= 0:
                return []
            with nogil:
                self.wait_prepare()
                self.wait_idle(min(left_ns, 50_000_000))

    def announce(self, addresses):
        """Introduce this endpoint to ``addresses`` before sending to them: verbs sends its
        queue pair's address (so that peers drop an older one at once); nothing to do for
        the others, whose address is all a peer needs."""
        if self.closed:
            raise RuntimeError("transport is closed")

    def block(self, double timeout):
        """Block until input may be waiting, ``notify()`` is called, or ``timeout`` s pass."""
        cdef int64_t ns = _timeout_ns(timeout)
        if self.closed:
            raise RuntimeError("transport is closed")
        with nogil:
            self.wait_prepare()
            self.wait_idle(ns)

    def notify(self):
        """Wake the thread blocked in ``block`` (or the gateway's adaptive wait)."""
        with nogil:
            self.wake()

    def close(self):
        """Release the transport's resources (idempotent)."""
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- udp

cdef class UdpTransport(Transport):
    """UDP with recvmmsg/sendmmsg on a nonblocking socket.

    Parameters
    ----------
    address : str or tuple
        Where to bind: ``"host:port"`` (port 0 picks a free one).
    bufbytes : int
        Socket send and receive buffer sizes to ask the kernel for.
    """
    cdef mc_udp* u
    cdef uint8_t* rxmem

    def __init__(self, address="127.0.0.1:0", int bufbytes=4 << 20):
        cdef NetAddr want
        cdef int rc, i
        self.kind = "udp"
        addr_parse("udp", address, &want)
        self.u = <mc_udp*>mc_aligned_alloc(64, sizeof(mc_udp))
        self.rxmem = <uint8_t*>mc_aligned_alloc(64, <size_t>BATCH * SLOT)
        if self.u == NULL or self.rxmem == NULL:
            raise MemoryError()
        rc = mc_udp_open(self.u, &want, bufbytes, SLOT, self.rxmem, self.txmem, &self.me)
        if rc < 0:
            free(self.u)
            self.u = NULL
            raise OSError(-rc, f"udp: cannot bind {format_addr(addr_py(&want))}: "
                               f"{strerror(-rc).decode()}")
        for i in range(BATCH):
            self.rx[i].data = self.rxmem + <size_t>i * SLOT
            self.rx[i].cap = SLOT
        self.closed = False

    def __dealloc__(self):
        if self.u != NULL:
            mc_udp_close(self.u)
            free(self.u)
        free(self.rxmem)

    def close(self):
        if not self.closed:
            self.closed = True
            mc_udp_close(self.u)

    cdef int rx_poll(self, int max_n) noexcept nogil:
        cdef int n, i
        if self.closed:
            return 0
        n = mc_udp_recv(self.u, max_n)
        for i in range(n):
            self.rx[i].len = self.u.rx[i].msg_len
            if mc_sa_to_addr(mc_udp_sa(self.u, i), &self.rx[i].peer) < 0:
                memset(&self.rx[i].peer, 0, sizeof(NetAddr))
        self.n_recv += n
        return n

    cdef int tx_flush(self) noexcept nogil:
        cdef uint32_t lens[BATCH]
        cdef NetAddr dsts[BATCH]
        cdef int i, n = self.n_tx
        cdef uint64_t dropped = 0
        if n == 0:
            return 0
        self.n_tx = 0
        if self.closed:
            self.n_send_failed += n
            return 0
        for i in range(n):
            lens[i] = self.tx[i].len
            dsts[i] = self.tx[i].peer
        mc_udp_send(self.u, lens, dsts, n, &dropped)
        self.n_send_failed += dropped
        self.n_sent += n - dropped
        return n - <int>dropped

    cdef void wait_prepare(self) noexcept nogil:
        mc_udp_prepare(self.u)

    cdef void wait_idle(self, int64_t timeout_ns) noexcept nogil:
        if self.closed:
            mc_udp_cancel(self.u)
            return
        mc_udp_wait(self.u, timeout_ns)

    cdef void wait_cancel(self) noexcept nogil:
        mc_udp_cancel(self.u)

    cdef void wake(self) noexcept nogil:
        if not self.closed:
            mc_udp_wake(self.u)


# ---------------------------------------------------------------- shm

cdef enum:
    MAX_SHM_PEERS = 256


ctypedef struct ShmPeer:
    uint8_t name[16]
    mc_ring_hdr* ring
    size_t size
    bint stalled        # full through a whole wait: no wait again until a message goes in


_names = itertools.count()


cdef class ShmTransport(Transport):
    """Processes on one host: each endpoint owns an inbound ring in ``/dev/shm``.

    Parameters
    ----------
    address : str or None
        This endpoint's name (at most 16 characters); ``None`` makes a unique one (clients).
    capacity : int
        Messages the inbound ring holds (a power of two).
    """
    cdef mc_ring_hdr* ring
    cdef size_t size
    cdef int fd                 # the ring's file, locked while this endpoint lives
    cdef ShmPeer* peers
    cdef int n_peers
    cdef uint32_t _ticket
    cdef public uint64_t n_full_waits   # peers' rings given up on as full (see tx_flush)

    def __init__(self, address=None, capacity=1024):
        cdef NetAddr a
        if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
            raise TransportUnavailable("shm transport: /dev/shm is missing or not writable "
                                       "(mount a tmpfs there)")
        # bounded as a rack file's shm_capacity: 2^30 made a 4.4 TB sparse ring that filled
        # the tmpfs (and outlived the process), 2^40 overflowed the C int
        if (isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral)
                or not 2 <= capacity <= MAX_SHM_CAPACITY or capacity & (capacity - 1)):
            raise ValueError(f"shm ring capacity {capacity!r} must be a power of two in "
                             f"2..{MAX_SHM_CAPACITY}")
        if address is None:
            address = f"c{os.getpid():x}-{next(_names)}"[:16]
        self.kind = "shm"
        self.fd = -1
        addr_parse("shm", address, &a)
        cdef size_t old_size
        cdef mc_ring_hdr* old
        cdef int err = 0
        with shm_reap.lock():       # no other process unlinks or makes a ring meanwhile
            shm_reap.reap()         # the rings of endpoints killed before they could
            old = mc_shm_attach(a.addr, &old_size)
            if old != NULL:
                # Like a bound udp port: a live owner keeps its name; a dead one's is reused.
                owner, alive = old.owner_pid, mc_shm_owner_running(old, a.addr)
                other = mc_shm_other_ns(old)
                if not alive:
                    mc_shm_mark_stopped(old)    # its peers' mappings let go of it
                mc_shm_detach(old, old_size)
                if alive and (other or owner != os.getpid()):
                    raise OSError(98, f"shm: endpoint name {address!r} is in use by process "
                                      f"{owner}" + (" of another pid namespace" if other else ""))
            self.ring = mc_shm_create(a.addr, capacity, SLOT + 64, &self.size, &self.fd)
            err = errno             # before the lock's release can set it
        if self.ring == NULL:
            raise OSError(err, f"shm: cannot create endpoint {address!r}: "
                               f"{strerror(err).decode()}")
        self.me = a
        self.peers = <ShmPeer*>mc_aligned_alloc(64, sizeof(ShmPeer) * MAX_SHM_PEERS)
        memset(self.peers, 0, sizeof(ShmPeer) * MAX_SHM_PEERS)
        self.n_peers = 0
        for i in range(BATCH):
            self.rx[i].cap = SLOT
        self.closed = False

    def __dealloc__(self):
        self._release()
        free(self.peers)

    cdef void _release(self):
        cdef int i
        if self.ring != NULL:
            mc_shm_destroy(self.ring, self.size, self.me.addr, self.fd)
            self.ring = NULL
            self.fd = -1
        if self.peers != NULL:
            for i in range(self.n_peers):
                if self.peers[i].ring != NULL:
                    mc_shm_detach(self.peers[i].ring, self.peers[i].size)
                    self.peers[i].ring = NULL
            self.n_peers = 0

    def close(self):
        if not self.closed:
            self.closed = True
            self._release()

    cdef ShmPeer* _peer(self, const NetAddr* dst) noexcept nogil:
        cdef int i
        cdef ShmPeer* p
        if dst.family != FAM_SHM:
            return NULL
        for i in range(self.n_peers):
            if memcmp(self.peers[i].name, dst.addr, 16) == 0:
                p = &self.peers[i]
                if p.ring != NULL and not p.ring.alive:
                    # The owner stopped cleanly: it may have been restarted under the name.
                    mc_shm_detach(p.ring, p.size)
                    p.ring = NULL
                if p.ring == NULL:
                    p.ring, p.stalled = mc_shm_attach(dst.addr, &p.size), False
                return p if p.ring != NULL else NULL
        self._unmap_stopped()       # a new peer: most often a client, where one has left
        if self.n_peers == MAX_SHM_PEERS:
            # Evict the oldest mapping; an endpoint table this big is only seen with many
            # short-lived clients.
            if self.peers[0].ring != NULL:
                mc_shm_detach(self.peers[0].ring, self.peers[0].size)
            memmove(self.peers, self.peers + 1, sizeof(ShmPeer) * (MAX_SHM_PEERS - 1))
            self.n_peers -= 1
        p = &self.peers[self.n_peers]
        memcpy(p.name, dst.addr, 16)
        p.stalled = False
        p.ring = mc_shm_attach(dst.addr, &p.size)
        if p.ring == NULL:
            return NULL
        self.n_peers += 1
        return p

    cdef void _unmap_stopped(self) noexcept nogil:
        # Unmap the rings of peers that stopped cleanly, and forget them: the next send to
        # the name, which a departed client never gets, was all that dropped one, so a
        # server kept 256 past clients' rings (17 MB of /dev/shm each for a loadgen).
        # A killed peer (alive still 1) is left to the eviction: telling it apart costs a
        # system call per peer.
        cdef int i, j = 0
        for i in range(self.n_peers):
            if self.peers[i].ring != NULL and not self.peers[i].ring.alive:
                mc_shm_detach(self.peers[i].ring, self.peers[i].size)
                self.peers[i].ring = NULL
            if self.peers[i].ring != NULL:
                if j != i:
                    self.peers[j] = self.peers[i]
                j += 1
        self.n_peers = j

    cdef int rx_poll(self, int max_n) noexcept nogil:
        cdef int i
        cdef mc_cell_hdr* c
        if self.closed:
            return 0
        for i in range(max_n):
            c = mc_ring_peek(self.ring, i)
            if c == NULL:
                break
            self.rx[i].data = <uint8_t*>(c + 1)
            self.rx[i].len = c.len
            memcpy(&self.rx[i].peer, c.src, sizeof(NetAddr))
        else:
            i = max_n
        self.n_recv += i
        return i

    cdef void rx_release(self, int n) noexcept nogil:
        if n > 0 and not self.closed:
            mc_ring_release(self.ring, n)

    cdef int tx_flush(self) noexcept nogil:
        cdef int i, spins, n = self.n_tx, ok = 0
        cdef ShmPeer* p = NULL
        cdef const NetAddr* prev = NULL
        cdef bint ring = False
        self.n_tx = 0
        if self.closed:
            self.n_send_failed += n
            return 0
        for i in range(n):
            # A run of messages to one peer: one lookup, one doorbell (a fence) after it.
            if prev == NULL or not addr_eq(&self.tx[i].peer, prev):
                if ring:
                    mc_bell_ring(&p.ring.bell)
                    ring = False
                p = self._peer(&self.tx[i].peer)
                prev = &self.tx[i].peer
            if p == NULL:
                self.n_send_failed += 1
                continue
            spins = 0
            while mc_ring_push(p.ring, <const uint8_t*>&self.me, self.tx[i].data,
                               self.tx[i].len) != 0:
                # Full: wait briefly for the owner to drain it, unless it is gone (by its
                # file's lock: a pid can be reused) or the ring stayed full through the last
                # wait (a SIGSTOPped owner runs; each heartbeat to it held the gateway ~0.6
                # ms). Doorbell and liveness are system calls: once every 1024 spins.
                if p.stalled:
                    break
                if (spins & 1023) == 0:
                    if spins > 20000 or not mc_shm_owner_running(p.ring, p.name):
                        break
                    mc_bell_ring(&p.ring.bell)
                spins += 1
                mc_cpu_relax()
            else:
                ring = True
                ok += 1
                p.stalled = False
                continue
            if not p.stalled:
                p.stalled = True
                self.n_full_waits += 1
            self.n_send_failed += 1
        if ring:
            mc_bell_ring(&p.ring.bell)
        self.n_sent += ok
        return ok

    cdef void wait_prepare(self) noexcept nogil:
        self._ticket = mc_bell_prepare(&self.ring.bell)

    cdef void wait_idle(self, int64_t timeout_ns) noexcept nogil:
        if self.closed or not mc_ring_empty(self.ring):
            mc_bell_cancel(&self.ring.bell)
            return
        self._unmap_stopped()       # idle: the rings of clients that left are let go
        mc_bell_wait(&self.ring.bell, self._ticket, timeout_ns)

    cdef void wait_cancel(self) noexcept nogil:
        mc_bell_cancel(&self.ring.bell)

    cdef void wake(self) noexcept nogil:
        if not self.closed:
            mc_bell_ring(&self.ring.bell)


# ---------------------------------------------------------------- factory

KINDS = ("udp", "shm", "verbs")


def _verbs_class():
    """The verbs transport lives in ``malcolm.net.verbs`` (another module, issue 7): it must
    expose ``VerbsTransport(address, **opts)``, a subclass of :class:`Transport`."""
    try:
        from malcolm.net import verbs
    except ImportError as e:
        raise TransportUnavailable(f"verbs transport is not available ({e})") from None
    try:
        cls = verbs.VerbsTransport
    except (ImportError, AttributeError, verbs.VerbsUnavailable) as e:
        # VerbsUnavailable: the native data path was not built (no libibverbs-dev on a fresh
        # machine); that is "not available here", never an error at import or collection.
        raise TransportUnavailable(
            f"verbs transport is not available ({e}); it needs libibverbs-dev and "
            "python3-pyverbs and a rebuild of malcolm.net._verbs") from None
    require = getattr(verbs, "require", None)
    if require is not None:
        try:
            require()
        except Exception as e:
            raise TransportUnavailable(f"verbs transport is not available: {e}") from None
    return cls


def open_transport(str kind, address=None, key=None, **opts):
    """Open a transport of ``kind`` bound to ``address``.

    Parameters
    ----------
    kind : str
        ``"udp"``, ``"shm"`` or ``"verbs"``.
    address : optional
        Where to bind (see each transport).
    key : bytes, optional
        The rack's 16-byte MAC key (:func:`malcolm.runtime.config.rack_key`), for a
        transport's own control messages: verbs authenticates its address queries and
        answers with it. udp and shm have none (their source is the socket's or the ring's),
        so they take no key; the messages themselves are authenticated by the wire layer
        (``Gateway.set_key``, ``Client(key=...)``) on every transport.
    **opts
        The transport's own options.

    Raises
    ------
    TransportUnavailable
        The kind is unknown or cannot run here; there is no silent fallback.
    """
    if kind == "udp":
        return UdpTransport("127.0.0.1:0" if address is None else address, **opts)
    if kind == "shm":
        return ShmTransport(address, **opts)
    if kind == "verbs":
        return _verbs_class()(address, key=key, **opts)
    raise TransportUnavailable(f"unknown transport {kind!r}; choose from {', '.join(KINDS)}")


def available_transports():
    """The kinds that can run on this machine, with the reason for each that cannot."""
    out, why = [], {}
    for kind in KINDS:
        try:
            if kind == "verbs":
                _verbs_class()
            elif kind == "shm" and not os.access("/dev/shm", os.W_OK):
                raise TransportUnavailable("/dev/shm is not writable")
            out.append(kind)
        except TransportUnavailable as e:
            why[kind] = str(e)
    return out, why
