# cython: language_level=3
"""Native encoders and decoders of the wire format; see ``malcolm.net.wire`` for the layout."""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from malcolm._system cimport CLOCK_REALTIME, clock_gettime, getrandom, timespec
from malcolm.policy.base cimport MAX_SVC_LG, MAX_THETA, Heartbeat, heartbeat_init


cdef const char* _ERRNAMES[16]
_ERRNAMES[0] = b"ok"
_ERRNAMES[1] = b"shorter than a header"
_ERRNAMES[2] = b"bad magic"
_ERRNAMES[3] = b"unsupported version"
_ERRNAMES[4] = b"unknown message kind"
_ERRNAMES[5] = b"length does not match"
_ERRNAMES[6] = b"payload too large"
_ERRNAMES[7] = b"field out of range"
_ERRNAMES[8] = b"too many critic parameters"
_ERRNAMES[9] = b"bad sender index"
_ERRNAMES[10] = b"sender address outside the rack"
_ERRNAMES[11] = b"unexpected message kind"
_ERRNAMES[12] = b"bad MAC"
_ERRNAMES[13] = b"replayed"
_ERRNAMES[14] = b"stale epoch"
_ERRNAMES[15] = b"stale heartbeat"

cdef enum:
    REPLAY_WINDOW = 64           # sequence numbers below the highest still accepted once


cdef const char* wire_error_name(int code) noexcept nogil:
    if code > 0 or code <= -E_NCODES:
        return b"unknown error"
    return _ERRNAMES[-code]


cdef inline void _put_hdr(uint8_t* buf, uint8_t kind, uint16_t src, uint32_t length) noexcept nogil:
    """``length`` is the body's; the header counts the trailer ``wire_seal`` appends."""
    mc_st16(buf, WIRE_MAGIC)
    buf[2] = WIRE_VERSION
    buf[3] = kind
    mc_st16(buf + 4, src)
    mc_st16(buf + 6, <uint16_t>(length + AUTH_LEN))


cdef uint32_t wire_seal(uint8_t* buf, uint32_t n, const mc_sipkey* key, uint64_t epoch,
                        uint64_t seq) noexcept nogil:
    """Append the trailer to a body of ``n`` bytes that a ``wire_put_*`` wrote (which left
    room for it); return the message's length, 0 if ``n`` is 0 (the body did not fit)."""
    if n == 0:
        return 0
    mc_st64(buf + n, epoch)
    mc_st64(buf + n + 8, seq)
    mc_st64(buf + n + 16, mc_siphash24(key, buf, n + 16))
    return n + AUTH_LEN


cdef void wire_dst_key(const mc_sipkey* base, uint16_t dst, mc_sipkey* out) noexcept nogil:
    """The key of the messages between servers that go to server ``dst``, derived from the
    rack key ``base`` (two SipHash outputs of a label and ``dst``). Each sender numbers its
    messages per destination, so under one key a message captured on its way to server j
    verified at server k too, and ran there again while k had not yet seen its number
    (docs/runtime.md, "Replays, epochs and membership"); under j's own key it does not."""
    cdef uint8_t msg[20]
    cdef uint8_t k[16]
    memcpy(msg, b"malcolm dst key:", 16)
    mc_st16(msg + 16, dst)
    msg[18] = 0
    msg[19] = 0
    mc_st64(k, mc_siphash24(base, msg, 20))
    msg[19] = 1
    mc_st64(k + 8, mc_siphash24(base, msg, 20))
    mc_sipkey_set(out, k)


cdef int wire_open(const uint8_t* buf, uint32_t n, const mc_sipkey* key, uint64_t* epoch,
                   uint64_t* seq) noexcept nogil:
    """Verify the MAC of a message whose header checked; return the body's length (> 0) or
    a negative WireError. The epoch and sequence number are for ``wire_replay_check``."""
    cdef uint64_t tag, want, diff
    if n < HDR_LEN + AUTH_LEN:
        return E_LENGTH
    tag = mc_ld64(buf + n - 8)
    want = mc_siphash24(key, buf, n - 8)
    diff = tag ^ want               # no early exit: the comparison takes the same time
    if diff != 0:
        return E_MAC
    epoch[0] = mc_ld64(buf + n - 24)
    seq[0] = mc_ld64(buf + n - 16)
    return <int>(n - AUTH_LEN)


cdef int wire_replay_check(WireReplay* r, uint64_t epoch, uint64_t seq) noexcept nogil:
    """Accept each (epoch, seq) of one sender at most once: 1 when it starts a new, larger
    epoch (the sender restarted; the state is reset to it), 0 when accepted in the current
    one, E_EPOCH for an older epoch (or 0), E_REPLAY for a number seen or more than
    REPLAY_WINDOW behind the highest. Sequence numbers start at 1."""
    cdef uint64_t back
    cdef int rc = 0
    if epoch == 0:
        # never a sender's (wire_new_epoch's clock bits), and the state's "none yet": a
        # client's replay slot then reset itself at every copy, and each copy ran
        return E_EPOCH
    if epoch != r.epoch:
        if epoch < r.epoch:
            return E_EPOCH
        r.epoch = epoch
        r.top = 0
        r.bits = 0
        rc = 1
    if seq > r.top:
        back = seq - r.top
        r.bits = 0 if back >= REPLAY_WINDOW else (r.bits << back)
        r.bits |= 1             # bit k: top - k was seen
        r.top = seq
        return rc
    back = r.top - seq
    if seq == 0 or back >= REPLAY_WINDOW or (r.bits >> back) & 1:
        return E_REPLAY
    r.bits |= (<uint64_t>1) << back
    return rc


cdef uint64_t wire_new_epoch() noexcept nogil:
    """A sender's epoch: the realtime clock in µs in the high bits (so a restart is larger),
    16 random bits in the low ones (two starts in one µs differ)."""
    cdef timespec ts
    cdef uint16_t rnd = 0
    clock_gettime(CLOCK_REALTIME, &ts)
    getrandom(&rnd, 2, 0)
    return ((<uint64_t>ts.tv_sec * 1000000 + <uint64_t>(ts.tv_nsec // 1000)) << 16) | rnd


cdef int wire_header(const uint8_t* buf, uint32_t n, WireHdr* h) noexcept nogil:
    """Check the header; return the kind (> 0) or a negative WireError."""
    if n < HDR_LEN:
        return E_SHORT
    if mc_ld16(buf) != WIRE_MAGIC:
        return E_MAGIC
    if buf[2] != WIRE_VERSION:
        return E_VERSION
    if buf[3] < 1 or buf[3] > K_MAX:
        return E_KIND
    h.kind = buf[3]
    h.src = mc_ld16(buf + 4)
    h.length = mc_ld16(buf + 6)
    if h.length != n:
        return E_LENGTH
    return h.kind


cdef inline void _get_core(const uint8_t* buf, WireTask* t) noexcept nogil:
    t.client_id = mc_ld32(buf + 8)
    t.task_type = mc_ld16(buf + 12)
    t.payload_len = mc_ld16(buf + 14)
    t.request_id = mc_ld64(buf + 16)
    t.service_ns = <int64_t>mc_ld64(buf + 24)
    t.send_ns = <int64_t>mc_ld64(buf + 32)
    t.budget_us = mc_ld32(buf + 40)       # 44..48 reserved (written 0, not checked)


cdef inline void _put_core(uint8_t* buf, const WireTask* t) noexcept nogil:
    mc_st32(buf + 8, t.client_id)
    mc_st16(buf + 12, t.task_type)
    mc_st16(buf + 14, t.payload_len)
    mc_st64(buf + 16, t.request_id)
    mc_st64(buf + 24, <uint64_t>t.service_ns)
    mc_st64(buf + 32, <uint64_t>t.send_ns)
    mc_st32(buf + 40, t.budget_us)
    mc_st32(buf + 44, 0)


cdef int wire_get_task(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil:
    """Decode a TASK. On E_FIELD/E_PAYLOAD the ids are filled, so the sender can be told."""
    if n < TASK_LEN:
        return E_LENGTH
    _get_core(buf, t)
    memset(&t.reply, 0, sizeof(NetAddr))
    t.origin = 0
    t.flags = 0
    t.seq = 0
    t.payload = buf + TASK_LEN
    if t.payload_len > MAX_PAYLOAD:
        return E_PAYLOAD
    if n != TASK_LEN + t.payload_len:
        return E_LENGTH
    if t.service_ns < 0:
        return E_FIELD
    return E_OK


cdef int wire_get_move(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil:
    """Decode a FORWARD (or the task inside a STEAL_REPLY)."""
    if n < MOVE_LEN:
        return E_LENGTH
    _get_core(buf, t)
    t.reply.family = mc_ld16(buf + 48)
    t.reply.port = mc_ld16(buf + 50)
    t.reply.extra = mc_ld32(buf + 52)
    memcpy(t.reply.addr, buf + 56, 16)
    t.origin = mc_ld16(buf + 72)
    t.flags = mc_ld16(buf + 74)
    t.seq = mc_ld32(buf + 76)
    t.payload = buf + MOVE_LEN
    if t.payload_len > MAX_PAYLOAD:
        return E_PAYLOAD
    if n != MOVE_LEN + t.payload_len:
        return E_LENGTH
    if t.service_ns < 0 or t.reply.family == 0 or (t.flags & ~3) != 0:
        return E_FIELD
    return E_OK


cdef int wire_get_steal_req(const uint8_t* buf, uint32_t n, uint32_t* seq,
                            int64_t* sent_ns) noexcept nogil:
    if n != STEAL_REQ_LEN:
        return E_LENGTH
    seq[0] = mc_ld32(buf + 8)
    sent_ns[0] = <int64_t>mc_ld64(buf + 16)
    return E_OK


cdef int wire_get_steal_reply(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil:
    """Return 0 for an empty reply (only ``t.seq`` is set), 1 when it carries a task."""
    cdef int rc
    if n == STEAL_EMPTY_LEN:
        t.seq = mc_ld32(buf + 8)
        t.payload_len = 0
        t.payload = NULL
        return 0
    rc = wire_get_move(buf, n, t)
    return rc if rc < 0 else 1


cdef int wire_get_resp(const uint8_t* buf, uint32_t n, WireResp* r) noexcept nogil:
    if n < RESP_LEN:
        return E_LENGTH
    r.client_id = mc_ld32(buf + 8)
    r.task_type = mc_ld16(buf + 12)
    r.payload_len = mc_ld16(buf + 14)
    r.request_id = mc_ld64(buf + 16)
    r.send_ns = <int64_t>mc_ld64(buf + 24)
    r.service_ns = <int64_t>mc_ld64(buf + 32)
    r.load = mc_ldf64(buf + 40)
    r.queue_len = mc_ld32(buf + 48)
    r.server = mc_ld16(buf + 52)
    r.status = buf[54]
    r.flags = buf[55]
    r.payload = buf + RESP_LEN
    if r.payload_len > MAX_PAYLOAD:
        return E_PAYLOAD
    if n != RESP_LEN + r.payload_len:
        return E_LENGTH
    if r.status > ST_OVERLOADED or (r.flags & ~3) != 0 or not mc_isfinite(r.load) or r.load < 0:
        return E_FIELD
    return E_OK


cdef int wire_get_heartbeat(const uint8_t* buf, uint32_t n, Heartbeat* hb,
                            int64_t* echo_ns, uint32_t* window_us) noexcept nogil:
    """A heartbeat into ``hb``; ``echo_ns``: the one-way delay the sender last measured from
    the receiver's heartbeats, on its clock against the receiver's (0: none yet);
    ``window_us``: the sender's window after it, so when its next heartbeat is due (0: not
    said; at most MAX_HB_WINDOW_US)."""
    cdef uint32_t k, nt
    if n < HB_LEN:
        return E_LENGTH
    nt = mc_ld16(buf + 12)
    if nt > MAX_THETA:
        return E_THETA
    if n != HB_LEN + 8 * nt:
        return E_LENGTH
    hb.src = mc_ld16(buf + 4)
    hb.seq = mc_ld32(buf + 8)
    hb.n_theta = nt
    hb.svc_lg = mc_ld16(buf + 14)       # 0: not known (and from a sender before the field)
    hb.sent_ns = <int64_t>mc_ld64(buf + 16)
    hb.load = mc_ldf64(buf + 24)
    hb.queue_len = mc_ldf64(buf + 32)
    hb.rate = mc_ldf64(buf + 40)
    hb.migrations = mc_ld64(buf + 48)
    hb.steals = mc_ld64(buf + 56)
    echo_ns[0] = <int64_t>mc_ld64(buf + 64)
    window_us[0] = mc_ld32(buf + 72)
    if window_us[0] > MAX_HB_WINDOW_US or mc_ld32(buf + 76) != 0:
        return E_FIELD
    if not (mc_isfinite(hb.load) and mc_isfinite(hb.queue_len) and mc_isfinite(hb.rate)):
        return E_FIELD
    if hb.load < 0 or hb.queue_len < 0 or hb.rate < 0 or hb.svc_lg > MAX_SVC_LG:
        return E_FIELD
    for k in range(nt):
        hb.theta[k] = mc_ldf64(buf + HB_LEN + 8 * k)
        if not mc_isfinite(hb.theta[k]):
            return E_FIELD
    return E_OK


cdef uint32_t wire_put_task(uint8_t* buf, uint32_t cap, const WireTask* t) noexcept nogil:
    """Encode a client's TASK; return its length, or 0 if it does not fit."""
    cdef uint32_t n = TASK_LEN + t.payload_len
    if t.payload_len > MAX_PAYLOAD or n + AUTH_LEN > cap:
        return 0
    _put_hdr(buf, K_TASK, CLIENT_SRC, n)
    _put_core(buf, t)
    if t.payload_len:
        memcpy(buf + TASK_LEN, t.payload, t.payload_len)
    return n


cdef uint32_t wire_put_move(uint8_t* buf, uint32_t cap, uint16_t src, uint8_t kind,
                            const WireTask* t) noexcept nogil:
    """Encode a FORWARD, or a STEAL_REPLY carrying a task (``kind`` says which)."""
    cdef uint32_t n = MOVE_LEN + t.payload_len
    if t.payload_len > MAX_PAYLOAD or n + AUTH_LEN > cap:
        return 0
    _put_hdr(buf, kind, src, n)
    _put_core(buf, t)
    mc_st16(buf + 48, t.reply.family)
    mc_st16(buf + 50, t.reply.port)
    mc_st32(buf + 52, t.reply.extra)
    memcpy(buf + 56, t.reply.addr, 16)
    mc_st16(buf + 72, t.origin)
    mc_st16(buf + 74, t.flags)
    mc_st32(buf + 76, t.seq)
    if t.payload_len:
        memcpy(buf + MOVE_LEN, t.payload, t.payload_len)
    return n


cdef uint32_t wire_put_steal_req(uint8_t* buf, uint32_t cap, uint16_t src, uint32_t seq,
                                 int64_t sent_ns) noexcept nogil:
    if cap < STEAL_REQ_LEN + AUTH_LEN:
        return 0
    _put_hdr(buf, K_STEAL_REQ, src, STEAL_REQ_LEN)
    mc_st32(buf + 8, seq)
    mc_st32(buf + 12, 0)
    mc_st64(buf + 16, <uint64_t>sent_ns)
    return STEAL_REQ_LEN


cdef uint32_t wire_put_steal_empty(uint8_t* buf, uint32_t cap, uint16_t src,
                                   uint32_t seq) noexcept nogil:
    if cap < STEAL_EMPTY_LEN + AUTH_LEN:
        return 0
    _put_hdr(buf, K_STEAL_REPLY, src, STEAL_EMPTY_LEN)
    mc_st32(buf + 8, seq)
    mc_st32(buf + 12, 0)
    return STEAL_EMPTY_LEN


cdef uint32_t wire_put_resp(uint8_t* buf, uint32_t cap, uint16_t src,
                            const WireResp* r) noexcept nogil:
    cdef uint32_t n = RESP_LEN + r.payload_len
    if r.payload_len > MAX_PAYLOAD or n + AUTH_LEN > cap:
        return 0
    _put_hdr(buf, K_RESPONSE, src, n)
    mc_st32(buf + 8, r.client_id)
    mc_st16(buf + 12, r.task_type)
    mc_st16(buf + 14, r.payload_len)
    mc_st64(buf + 16, r.request_id)
    mc_st64(buf + 24, <uint64_t>r.send_ns)
    mc_st64(buf + 32, <uint64_t>r.service_ns)
    mc_stf64(buf + 40, r.load)
    mc_st32(buf + 48, r.queue_len)
    mc_st16(buf + 52, r.server)
    buf[54] = r.status
    buf[55] = r.flags
    if r.payload_len:
        memcpy(buf + RESP_LEN, r.payload, r.payload_len)
    return n


cdef uint32_t wire_put_heartbeat(uint8_t* buf, uint32_t cap, uint16_t src,
                                 const Heartbeat* hb, int64_t echo_ns,
                                 uint32_t window_us) noexcept nogil:
    cdef int32_t k, nt = hb.n_theta
    cdef uint32_t n
    if nt < 0 or nt > MAX_THETA:
        return 0
    n = HB_LEN + 8 * nt
    if n + AUTH_LEN > cap:
        return 0
    _put_hdr(buf, K_HEARTBEAT, src, n)
    mc_st32(buf + 8, hb.seq)
    mc_st16(buf + 12, <uint16_t>nt)
    mc_st16(buf + 14, <uint16_t>(hb.svc_lg if 0 < hb.svc_lg <= MAX_SVC_LG else 0))
    mc_st64(buf + 16, <uint64_t>hb.sent_ns)
    mc_stf64(buf + 24, hb.load)
    mc_stf64(buf + 32, hb.queue_len)
    mc_stf64(buf + 40, hb.rate)
    mc_st64(buf + 48, hb.migrations)
    mc_st64(buf + 56, hb.steals)
    mc_st64(buf + 64, <uint64_t>echo_ns)
    mc_st32(buf + 72, window_us if window_us <= MAX_HB_WINDOW_US else MAX_HB_WINDOW_US)
    mc_st32(buf + 76, 0)
    for k in range(nt):
        mc_stf64(buf + HB_LEN + 8 * k, hb.theta[k])
    return n


# ---------------------------------------------------------------- Python entry points
# For tests, tools and Python clients: the runtime itself calls the cdef functions above.

class BadMessage(ValueError):
    """A message failed validation; ``code`` is the negative WireError, ``reason`` its name."""

    def __init__(self, code, reason):
        super().__init__(reason)
        self.code = code
        self.reason = reason


def error_name(int code):
    """The reason string of a negative WireError code."""
    return wire_error_name(code).decode()


def _raise(int code):
    raise BadMessage(code, wire_error_name(code).decode())


ZERO_KEY = bytes(16)
_auto_seq = [0]


def dst_key(key, int dst):
    """The 16 bytes of the key that signs what a server of a rack keyed with ``key`` sends to
    server ``dst`` (:c:func:`wire_dst_key`): heartbeats, forwards and steals; a client's
    tasks and the responses to clients stay under ``key`` itself; None (no rack key) stays
    None, as the gateway derives nothing then. For tools and tests that speak for a member."""
    cdef mc_sipkey base, out
    cdef uint8_t raw[16]
    if key is None:
        return None
    base = _key(key)
    if not 0 <= dst < 65536:
        raise ValueError(f"a server index is 0..65535, got {dst}")
    wire_dst_key(&base, <uint16_t>dst, &out)
    # mc_sipkey_set reads the 16 bytes as two little-endian words
    mc_st64(raw, out.k0)
    mc_st64(raw + 8, out.k1)
    return bytes(raw[:16])


cdef mc_sipkey _key(object key) except *:
    """The MAC key of a 16-byte ``key``; None is the all-zero key of an unauthenticated rack."""
    cdef mc_sipkey k
    cdef bytes b = ZERO_KEY if key is None else bytes(key)
    if len(b) != 16:
        raise ValueError(f"a rack MAC key is 16 bytes, got {len(b)}")
    mc_sipkey_set(&k, <const uint8_t*>(<const char*>b))
    return k


cdef uint64_t _seq(object auth_seq) except? 0:
    if auth_seq is None:
        # Tools and tests that do not count: every message this process encodes gets a
        # larger number, so a receiver's replay check accepts them in order.
        _auto_seq[0] += 1
        return _auto_seq[0]
    return auth_seq


cdef bytes _sealed(uint8_t* buf, uint32_t n, object key, uint64_t epoch, object auth_seq):
    cdef mc_sipkey k = _key(key)
    cdef uint32_t m = wire_seal(buf, n, &k, epoch, _seq(auth_seq))
    return bytes(buf[:m])


def siphash24(bytes key not None, const uint8_t[::1] data not None):
    """SipHash-2-4 of ``data`` under a 16-byte ``key`` (the native one; tests, tools)."""
    cdef mc_sipkey k = _key(key)
    cdef uint8_t empty[1]
    return mc_siphash24(&k, &data[0] if data.shape[0] else empty, data.shape[0])


def new_epoch():
    """A fresh sender epoch (realtime µs << 16 | 16 random bits)."""
    return wire_new_epoch()


class ReplayWindow:
    """Python twin of ``wire_replay_check`` for tools and tests: ``check(epoch, seq)``
    returns 1 (new epoch), 0 (accepted) or a negative WireError."""

    def __init__(self):
        self.state = (0, 0, 0)

    def check(self, uint64_t epoch, uint64_t seq):
        cdef WireReplay r
        r.epoch, r.top, r.bits = self.state
        rc = wire_replay_check(&r, epoch, seq)
        self.state = (r.epoch, r.top, r.bits)
        return rc


cdef NetAddr _addr_from(object a) except *:
    cdef NetAddr out
    memset(&out, 0, sizeof(NetAddr))
    if a is None:
        return out
    fam, port, extra, raw = a
    raw = bytes(raw)
    if len(raw) > 16:
        raise ValueError("address bytes longer than 16")
    out.family = fam
    out.port = port
    out.extra = extra
    memcpy(out.addr, <const char*>raw, len(raw))
    return out


cdef object _addr_to(const NetAddr* a):
    return (a.family, a.port, a.extra, bytes(a.addr[:16]))


cdef WireTask _task_from(client_id, request_id, task_type, service_ns, send_ns, payload,
                         reply, origin, flags, seq, budget_us=0) except *:
    cdef WireTask t
    memset(&t, 0, sizeof(WireTask))
    t.client_id = client_id
    t.request_id = request_id
    t.task_type = task_type
    t.service_ns = service_ns
    t.send_ns = send_ns
    t.payload_len = len(payload)
    t.reply = _addr_from(reply)
    t.origin = origin
    t.flags = flags
    t.seq = seq
    t.budget_us = budget_us
    return t


def encode_task(uint32_t client_id, uint64_t request_id, uint16_t task_type=0,
                int64_t service_ns=0, int64_t send_ns=0, bytes payload=b"", key=None,
                uint64_t epoch=1, auth_seq=None, uint32_t budget_us=0):
    """Encode a TASK as a client sends it (``budget_us``: its deadline, relative; 0 none)."""
    cdef uint8_t buf[MAX_MSG]
    cdef WireTask t = _task_from(client_id, request_id, task_type, service_ns, send_ns,
                                 payload, None, 0, 0, 0, budget_us)
    t.payload = <const uint8_t*>(<const char*>payload)
    cdef uint32_t n = wire_put_task(buf, MAX_MSG, &t)
    if n == 0:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    return _sealed(buf, n, key, epoch, auth_seq)


def encode_move(uint16_t src, uint32_t client_id, uint64_t request_id, reply,
                uint16_t task_type=0, int64_t service_ns=0, int64_t send_ns=0,
                bytes payload=b"", uint16_t origin=0, uint16_t flags=F_MIGRATED,
                uint32_t seq=0, bint steal_reply=False, key=None, uint64_t epoch=1,
                auth_seq=None, uint32_t budget_us=0):
    """Encode a FORWARD (or a STEAL_REPLY with a task); ``reply`` is (family, port, extra, addr)."""
    cdef uint8_t buf[MAX_MSG]
    cdef WireTask t = _task_from(client_id, request_id, task_type, service_ns, send_ns,
                                 payload, reply, origin, flags, seq, budget_us)
    t.payload = <const uint8_t*>(<const char*>payload)
    cdef uint32_t n = wire_put_move(buf, MAX_MSG, src,
                                    K_STEAL_REPLY if steal_reply else K_FORWARD, &t)
    if n == 0:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    return _sealed(buf, n, key, epoch, auth_seq)


def encode_steal_request(uint16_t src, uint32_t seq, int64_t sent_ns=0, key=None,
                         uint64_t epoch=1, auth_seq=None):
    cdef uint8_t buf[STEAL_REQ_LEN + AUTH_LEN]
    cdef uint32_t n = wire_put_steal_req(buf, STEAL_REQ_LEN + AUTH_LEN, src, seq, sent_ns)
    return _sealed(buf, n, key, epoch, auth_seq)


def encode_steal_empty(uint16_t src, uint32_t seq, key=None, uint64_t epoch=1,
                       auth_seq=None):
    cdef uint8_t buf[STEAL_EMPTY_LEN + AUTH_LEN]
    cdef uint32_t n = wire_put_steal_empty(buf, STEAL_EMPTY_LEN + AUTH_LEN, src, seq)
    return _sealed(buf, n, key, epoch, auth_seq)


def encode_response(uint16_t src, uint32_t client_id, uint64_t request_id,
                    uint16_t task_type=0, int64_t send_ns=0, int64_t service_ns=0,
                    double load=0.0, uint32_t queue_len=0, uint16_t server=0,
                    uint8_t status=ST_OK, uint8_t flags=0, bytes payload=b"", key=None,
                    uint64_t epoch=1, auth_seq=None):
    cdef uint8_t buf[MAX_MSG]
    cdef WireResp r
    r.client_id = client_id
    r.request_id = request_id
    r.task_type = task_type
    r.send_ns = send_ns
    r.service_ns = service_ns
    r.load = load
    r.queue_len = queue_len
    r.server = server
    r.status = status
    r.flags = flags
    r.payload_len = len(payload)
    r.payload = <const uint8_t*>(<const char*>payload)
    cdef uint32_t n = wire_put_resp(buf, MAX_MSG, src, &r)
    if n == 0:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    return _sealed(buf, n, key, epoch, auth_seq)


def encode_heartbeat(uint16_t src, uint32_t seq=0, int64_t sent_ns=0, double load=0.0,
                     double queue_len=0.0, double rate=0.0, uint64_t migrations=0,
                     uint64_t steals=0, theta=(), key=None, uint64_t epoch=1,
                     auth_seq=None, int svc_lg=0, int64_t echo_ns=0, uint32_t window_us=0):
    cdef uint8_t buf[MAX_MSG]
    cdef Heartbeat hb
    if window_us > MAX_HB_WINDOW_US:
        raise ValueError(f"window_us={window_us} must be in 0..{MAX_HB_WINDOW_US}")
    heartbeat_init(&hb, src, seq, sent_ns, load, queue_len, rate, migrations, steals, theta,
                   svc_lg)
    cdef uint32_t n = wire_put_heartbeat(buf, MAX_MSG, src, &hb, echo_ns, window_us)
    return _sealed(buf, n, key, epoch, auth_seq)


_KIND_NAMES = {K_TASK: "task", K_RESPONSE: "response", K_FORWARD: "forward",
               K_STEAL_REQ: "steal_request", K_STEAL_REPLY: "steal_reply",
               K_HEARTBEAT: "heartbeat"}


def decode(const uint8_t[::1] data not None, key=None):
    """Validate and decode one message into a dict; raise ``BadMessage`` with the reason.

    ``key`` is the rack's 16-byte MAC key (None: the all-zero key of an unauthenticated
    rack). The dict has the trailer's ``epoch`` and ``auth_seq``."""
    cdef uint32_t n = data.shape[0]
    cdef mc_sipkey mk = _key(key)
    cdef uint64_t epoch = 0, aseq = 0
    cdef const uint8_t* buf = &data[0] if n else NULL
    cdef uint8_t empty[1]
    cdef WireHdr h
    cdef WireTask t
    cdef WireResp r
    cdef Heartbeat hb
    cdef uint32_t seq
    cdef int64_t sent, echo = 0
    cdef uint32_t hb_window = 0
    cdef int rc
    if n == 0:
        buf = empty
    rc = wire_header(buf, n, &h)
    if rc < 0:
        _raise(rc)
    rc = wire_open(buf, n, &mk, &epoch, &aseq)
    if rc < 0:
        _raise(rc)
    n = <uint32_t>rc
    out = {"kind": _KIND_NAMES[h.kind], "src": h.src, "length": h.length, "epoch": epoch,
           "auth_seq": aseq}
    if h.kind == K_TASK or h.kind == K_FORWARD or h.kind == K_STEAL_REPLY:
        if h.kind == K_TASK:
            rc = wire_get_task(buf, n, &t)
        elif h.kind == K_FORWARD:
            rc = wire_get_move(buf, n, &t)
        else:
            rc = wire_get_steal_reply(buf, n, &t)
            if rc == 0:
                out.update(seq=t.seq, empty=True)
                return out
        if rc < 0:
            _raise(rc)
        out.update(client_id=t.client_id, request_id=t.request_id, task_type=t.task_type,
                   service_ns=t.service_ns, send_ns=t.send_ns, budget_us=t.budget_us,
                   payload=bytes(t.payload[:t.payload_len]))
        if h.kind != K_TASK:
            out.update(reply=_addr_to(&t.reply), origin=t.origin, flags=t.flags, seq=t.seq,
                       empty=False)
    elif h.kind == K_STEAL_REQ:
        rc = wire_get_steal_req(buf, n, &seq, &sent)
        if rc < 0:
            _raise(rc)
        out.update(seq=seq, sent_ns=sent)
    elif h.kind == K_RESPONSE:
        rc = wire_get_resp(buf, n, &r)
        if rc < 0:
            _raise(rc)
        out.update(client_id=r.client_id, request_id=r.request_id, task_type=r.task_type,
                   send_ns=r.send_ns, service_ns=r.service_ns, load=r.load,
                   queue_len=r.queue_len, server=r.server, status=r.status, flags=r.flags,
                   payload=bytes(r.payload[:r.payload_len]))
    else:
        rc = wire_get_heartbeat(buf, n, &hb, &echo, &hb_window)
        if rc < 0:
            _raise(rc)
        out.update(seq=hb.seq, sent_ns=hb.sent_ns, load=hb.load, queue_len=hb.queue_len,
                   rate=hb.rate, migrations=hb.migrations, steals=hb.steals, svc_lg=hb.svc_lg,
                   echo_ns=echo, window_us=hb_window,
                   theta=[hb.theta[k] for k in range(hb.n_theta)])
    return out


def check(const uint8_t[::1] data not None, key=None):
    """Return 0 if the message is valid, else its negative WireError code (never raises)."""
    try:
        decode(data, key)
    except BadMessage as e:
        return e.code
    return 0
