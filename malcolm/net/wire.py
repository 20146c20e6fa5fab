"""The wire format of the malcolm runtime: compact, versioned, little-endian binary messages.

This module is the readable reference. It encodes and decodes with :mod:`struct`; the runtime
uses the native twins in ``malcolm.net._wire`` (``cimport`` them, all ``nogil``), and the test
suite checks that both agree byte for byte. Network data is parsed field by field, checked for
length and bounds, and never unpickled.

Every message starts with an 8-byte header and ends with a 24-byte trailer::

    off size field
    0   2    magic    0x4C4D (bytes "ML")
    2   1    version  5 (3: tasks carry the client's deadline, ``budget_us``; 4: heartbeats
                      carry ``echo_ns``; 5: and ``window_us``)
    3   1    kind     1 task, 2 response, 3 forward, 4 steal request, 5 steal reply, 6 heartbeat
    4   2    src      sender's server index in the rack; 0xFFFF for a client
    6   2    length   whole message in bytes, trailer included; must equal the bytes received
    ...      body     by kind, below (offsets from the start of the message)
    n-24 8   epoch    the sender's epoch: realtime µs << 16 | 16 random bits, new at each start
    n-16 8   seq      the sender's sequence number (per destination server; per message to
                      clients), from 1
    n-8  8   mac      SipHash-2-4 of bytes 0..n-8 (all of the above) under the rack key, or,
                      between servers, under the destination's key (``dst_key``)

The rack key is 16 bytes derived from the rack's key file (``malcolm.runtime.config.read_key``); a
rack without one uses the all-zero key, which detects corruption but authenticates nothing.

Kinds (offsets from the start of the message)::

    TASK (48 + payload)            client -> server
      8 u32 client_id   12 u16 task_type   14 u16 payload_len   16 u64 request_id
     24 i64 service_ns (requested, >= 0)   32 i64 send_ns (intended send time)
     40 u32 budget_us (the client's deadline: µs it will wait from now; 0 none)   44 u32 0
     48 payload
    FORWARD (80 + payload)         server -> server, a migrated task
      8..48 as TASK (budget_us: what is left of it at the sender), then 48 addr reply
     (24 bytes, see below)   72 u16 origin   74 u16 flags (1 migrated, 2 stolen)
     76 u32 seq   80 payload
    STEAL_REQ (24)                 thief -> victim
      8 u32 seq   12 u32 0   16 i64 sent_ns
    STEAL_REPLY                    victim -> thief: 16 bytes (8 u32 seq, 12 u32 0) when it has
                                   nothing, else the FORWARD layout carrying the stolen task
    RESPONSE (56 + payload)        server -> client
      8 u32 client_id   12 u16 task_type   14 u16 payload_len   16 u64 request_id
     24 i64 send_ns (echoed)   32 i64 service_ns (measured)   40 f64 load (ns)
     48 u32 queue_len   52 u16 server   54 u8 status   55 u8 flags   56 payload
    HEARTBEAT (80 + 8 * n_theta)   server -> server, once per window
      8 u32 seq   12 u16 n_theta (<= 256)   14 u16 svc_lg (<= 12288; 0: not known)
     16 i64 sent_ns   24 f64 load   32 f64 queue_len   40 f64 rate   48 u64 migrations
     56 u64 steals   64 i64 echo_ns   72 u32 window_us (<= 60 000 000; 0: not said)
     76 u32 0   80 f64 theta[n_theta]
    (svc_lg: 256 log2 of the sender's geometric-mean service time in ns, for the hop gate;
    echo_ns: the sender's clock when it last took in one of the destination's heartbeats less
    that heartbeat's sent_ns, 0 before the first: with the destination's own such delay it
    gives the hop without synchronized clocks, as NTP does; window_us: the sender's window
    after it, so when its next heartbeat is due: a quiet rack's are long)

An address (``reply``) is 24 bytes: u16 family (2 IPv4, 10 IPv6, 0x5348 shm), u16 port,
u32 extra (IPv6 scope id), 16 bytes of address (IPv4 in the first 4; an shm endpoint name).
Payloads are at most 1024 bytes; no message is over 4032 bytes. Layout sizes below are of
the body, without the 24-byte trailer.
"""

from __future__ import annotations

import math
import struct
from enum import IntEnum

from malcolm.net import _wire as _native

# The native twins, re-exported: same signatures and results as the reference below.
BadMessage = _native.BadMessage
check = _native.check
error_name = _native.error_name
decode_native = _native.decode
encode_task_native = _native.encode_task
encode_move_native = _native.encode_move
encode_steal_request_native = _native.encode_steal_request
encode_steal_empty_native = _native.encode_steal_empty
encode_response_native = _native.encode_response
encode_heartbeat_native = _native.encode_heartbeat
siphash24_native = _native.siphash24
ReplayWindow = _native.ReplayWindow
new_epoch = _native.new_epoch

MAGIC = 0x4C4D
VERSION = 5
AUTH_LEN = 24
ZERO_KEY = bytes(16)
E_MAC, E_REPLAY, E_EPOCH, E_STALE = -12, -13, -14, -15
CLIENT_SRC = 0xFFFF
MAX_PAYLOAD = 1024
MAX_MSG = 4032
MAX_THETA = 256
MAX_SVC_LG = 12288      # a heartbeat's speed code: 256 log2 of the service time in ns
HB_LEN = 80             # a heartbeat's fixed part (theta follows)
MAX_HB_WINDOW_US = 60_000_000   # a heartbeat's window_us: at most idle_window_us's bound
FAM_SHM = 0x5348


class Kind(IntEnum):
    TASK = 1
    RESPONSE = 2
    FORWARD = 3
    STEAL_REQ = 4
    STEAL_REPLY = 5
    HEARTBEAT = 6


class Status(IntEnum):
    """How a task ended, as a response reports it."""

    OK = 0
    DROPPED = 1         # no room in the server's queue
    BAD_INPUT = 2       # a field of the task was out of range
    HANDLER_ERROR = 3   # the handler returned an error
    STOPPED = 4         # the server stopped before running the task
    TIMED_OUT = 5       # waited in the queue longer than the server's task timeout
    OVERLOADED = 6      # refused at arrival: the expected wait was over the server's max_wait_ms


MIGRATED = 1
STOLEN = 2

_HDR = struct.Struct("<HBBHH")
_CORE = struct.Struct("<IHHQqqII")
_ADDR = struct.Struct("<HHI16s")
_MOVE_TAIL = struct.Struct("<HHI")
_RESP = struct.Struct("<IHHQqqdIHBB")
_HB = struct.Struct("<IHHqdddQQqII")


def _hdr(kind, src, length):
    """``length`` is the body's; the header counts the trailer."""
    return _HDR.pack(MAGIC, VERSION, kind, src, length + AUTH_LEN)


_M64 = (1 << 64) - 1


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 with a 16-byte key, 64-bit result (Aumasson and Bernstein, 2012): the
    readable reference of ``malcolm/net/_siphash.h``."""
    if len(key) != 16:
        raise ValueError(f"a SipHash key is 16 bytes, got {len(key)}")
    k0, k1 = struct.unpack("<QQ", key)
    v = [0x736F6D6570736575 ^ k0, 0x646F72616E646F6D ^ k1,
         0x6C7967656E657261 ^ k0, 0x7465646279746573 ^ k1]

    def rounds(r):
        v0, v1, v2, v3 = v
        for _ in range(r):
            v0 = (v0 + v1) & _M64
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _M64
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _M64
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _M64
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)
        v[:] = [v0, v1, v2, v3]

    n = len(data)
    full = n - n % 8
    for i in range(0, full, 8):
        (m,) = struct.unpack_from("<Q", data, i)
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    b = (n & 0xFF) << 56 | int.from_bytes(data[full:], "little")
    v[3] ^= b
    rounds(2)
    v[0] ^= b
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


_auto_seq = [0]


def dst_key(key, dst: int) -> bytes:
    """The key of what a server sends server ``dst`` (heartbeats, forwards, steals): two
    SipHash outputs of a label and ``dst`` under the rack key. A sequence number counts per
    destination, so under one key a message captured on its way to server j verified at
    server k too, and ran there again while k had not seen its number. A client's tasks
    and their responses stay under the rack key. A rack without a key (None) does not
    derive: its servers sign everything with the all-zero key, as the gateway does."""
    if key is None:
        return None
    base = bytes(key)
    msg = b"malcolm dst key:" + struct.pack("<H", dst)
    return struct.pack("<QQ", siphash24(base, msg + b"\0\0"), siphash24(base, msg + b"\0\1"))


def seal(body: bytes, key=None, epoch=1, auth_seq=None) -> bytes:
    """Append the trailer (epoch, sequence number, MAC) to a body from ``_hdr`` + fields.

    ``auth_seq=None`` takes the next number of a process-wide counter (tools and tests)."""
    if auth_seq is None:
        _auto_seq[0] += 1
        auth_seq = _auto_seq[0]
    head = body + struct.pack("<QQ", epoch, auth_seq)
    return head + struct.pack("<Q", siphash24(ZERO_KEY if key is None else bytes(key), head))


def encode_task(client_id, request_id, task_type=0, service_ns=0, send_ns=0, payload=b"",
                key=None, epoch=1, auth_seq=None, budget_us=0):
    """Encode a TASK as a client sends it (``key``, ``epoch``, ``auth_seq``: the trailer)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    n = 48 + len(payload)
    return seal(_hdr(Kind.TASK, CLIENT_SRC, n)
                + _CORE.pack(client_id, task_type, len(payload), request_id, service_ns,
                             send_ns, budget_us, 0)
                + payload, key, epoch, auth_seq)


def encode_move(src, client_id, request_id, reply, task_type=0, service_ns=0, send_ns=0,
                payload=b"", origin=0, flags=MIGRATED, seq=0, steal_reply=False, key=None,
                epoch=1, auth_seq=None, budget_us=0):
    """Encode a FORWARD, or a STEAL_REPLY carrying a task.

    ``reply`` is the client's address as (family, port, extra, addr16)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    n = 80 + len(payload)
    fam, port, extra, raw = reply
    kind = Kind.STEAL_REPLY if steal_reply else Kind.FORWARD
    return seal(_hdr(kind, src, n)
                + _CORE.pack(client_id, task_type, len(payload), request_id, service_ns,
                             send_ns, budget_us, 0)
                + _ADDR.pack(fam, port, extra, bytes(raw).ljust(16, b"\0"))
                + _MOVE_TAIL.pack(origin, flags, seq) + payload, key, epoch, auth_seq)


def encode_steal_request(src, seq, sent_ns=0, key=None, epoch=1, auth_seq=None):
    return seal(_hdr(Kind.STEAL_REQ, src, 24) + struct.pack("<IIq", seq, 0, sent_ns),
                key, epoch, auth_seq)


def encode_steal_empty(src, seq, key=None, epoch=1, auth_seq=None):
    return seal(_hdr(Kind.STEAL_REPLY, src, 16) + struct.pack("<II", seq, 0),
                key, epoch, auth_seq)


def encode_response(src, client_id, request_id, task_type=0, send_ns=0, service_ns=0,
                    load=0.0, queue_len=0, server=0, status=Status.OK, flags=0, payload=b"",
                    key=None, epoch=1, auth_seq=None):
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    n = 56 + len(payload)
    return seal(_hdr(Kind.RESPONSE, src, n)
                + _RESP.pack(client_id, task_type, len(payload), request_id, send_ns,
                             service_ns, load, queue_len, server, status, flags) + payload,
                key, epoch, auth_seq)


def encode_heartbeat(src, seq=0, sent_ns=0, load=0.0, queue_len=0.0, rate=0.0, migrations=0,
                     steals=0, theta=(), key=None, epoch=1, auth_seq=None, svc_lg=0,
                     echo_ns=0, window_us=0):
    if len(theta) > MAX_THETA:
        raise ValueError(f"at most {MAX_THETA} critic parameters")
    if not 0 <= svc_lg <= MAX_SVC_LG:
        raise ValueError(f"svc_lg={svc_lg} must be in 0..{MAX_SVC_LG}")
    if not 0 <= window_us <= MAX_HB_WINDOW_US:
        raise ValueError(f"window_us={window_us} must be in 0..{MAX_HB_WINDOW_US}")
    n = HB_LEN + 8 * len(theta)
    return seal(_hdr(Kind.HEARTBEAT, src, n)
                + _HB.pack(seq, len(theta), svc_lg, sent_ns, load, queue_len, rate, migrations,
                           steals, echo_ns, window_us, 0)
                + struct.pack(f"<{len(theta)}d", *theta), key, epoch, auth_seq)


def decode(data: bytes, key=None) -> dict:
    """Pure-Python decoder with the same checks as the native one; raises ``BadMessage``.

    ``key``: the rack's 16-byte MAC key (None: the all-zero key)."""
    def bad(code):
        raise BadMessage(code, error_name(code))

    n = len(data)
    if n < 8:
        bad(-1)
    magic, version, kind, src, length = _HDR.unpack_from(data)
    if magic != MAGIC:
        bad(-2)
    if version != VERSION:
        bad(-3)
    if not 1 <= kind <= 6:
        bad(-4)
    if length != n:
        bad(-5)
    if n < 8 + AUTH_LEN:
        bad(-5)
    epoch, auth_seq, tag = struct.unpack_from("<QQQ", data, n - AUTH_LEN)
    if siphash24(ZERO_KEY if key is None else bytes(key), bytes(data[:n - 8])) != tag:
        bad(-12)
    data = data[:n - AUTH_LEN]
    n -= AUTH_LEN
    kind = Kind(kind)
    out = {"kind": {1: "task", 2: "response", 3: "forward", 4: "steal_request",
                    5: "steal_reply", 6: "heartbeat"}[kind], "src": src, "length": length,
           "epoch": epoch, "auth_seq": auth_seq}
    if kind == Kind.STEAL_REPLY and n == 16:
        out.update(seq=struct.unpack_from("<I", data, 8)[0], empty=True)
        return out
    if kind in (Kind.TASK, Kind.FORWARD, Kind.STEAL_REPLY):
        fixed = 48 if kind == Kind.TASK else 80
        if n < fixed:
            bad(-5)
        cid, tt, plen, rid, svc, sent, budget, _ = _CORE.unpack_from(data, 8)
        if plen > MAX_PAYLOAD:
            bad(-6)
        if n != fixed + plen:
            bad(-5)
        out.update(client_id=cid, request_id=rid, task_type=tt, service_ns=svc, send_ns=sent,
                   budget_us=budget, payload=bytes(data[fixed:]))
        if kind != Kind.TASK:
            fam, port, extra, raw = _ADDR.unpack_from(data, 48)
            origin, flags, seq = _MOVE_TAIL.unpack_from(data, 72)
            if svc < 0 or fam == 0 or flags & ~3:
                bad(-7)
            out.update(reply=(fam, port, extra, raw), origin=origin, flags=flags, seq=seq,
                       empty=False)
        elif svc < 0:
            bad(-7)
    elif kind == Kind.STEAL_REQ:
        if n != 24:
            bad(-5)
        seq, _, sent = struct.unpack_from("<IIq", data, 8)
        out.update(seq=seq, sent_ns=sent)
    elif kind == Kind.RESPONSE:
        if n < 56:
            bad(-5)
        (cid, tt, plen, rid, sent, svc, load, ql, server, status,
         flags) = _RESP.unpack_from(data, 8)
        if plen > MAX_PAYLOAD:
            bad(-6)
        if n != 56 + plen:
            bad(-5)
        if status > 6 or flags & ~3 or not math.isfinite(load) or load < 0:
            bad(-7)
        out.update(client_id=cid, request_id=rid, task_type=tt, send_ns=sent, service_ns=svc,
                   load=load, queue_len=ql, server=server, status=status, flags=flags,
                   payload=bytes(data[56:]))
    else:
        if n < HB_LEN:
            bad(-5)
        seq, nt, svc_lg, sent, load, ql, rate, mig, st, echo, win, zero = \
            _HB.unpack_from(data, 8)
        if nt > MAX_THETA:
            bad(-8)
        if n != HB_LEN + 8 * nt:
            bad(-5)
        theta = list(struct.unpack_from(f"<{nt}d", data, HB_LEN))
        if svc_lg > MAX_SVC_LG or not all(math.isfinite(v) and v >= 0
                                           for v in (load, ql, rate)):
            bad(-7)
        if win > MAX_HB_WINDOW_US or zero != 0:
            bad(-7)
        if not all(math.isfinite(v) for v in theta):
            bad(-7)
        out.update(seq=seq, sent_ns=sent, load=load, queue_len=ql, rate=rate, migrations=mig,
                   steals=st, svc_lg=svc_lg, echo_ns=echo, window_us=win, theta=theta)
    return out
