"""Wire format: the native codec agrees with the pure-Python reference, byte for byte (the
authentication trailer included), and rejects malformed input (with the same reason) instead
of reading out of bounds."""

import math
import random
import struct

import pytest

from malcolm.net import _wire as native
from malcolm.net import wire

REPLY = (2, 7001, 0, bytes([127, 0, 0, 1]) + bytes(12))

SAMPLES = [
    ("task", dict(client_id=7, request_id=2**40 + 5, task_type=3, service_ns=25_000,
                  send_ns=123456789, payload=b"abc")),
    ("task", dict(client_id=0, request_id=0)),
    ("task", dict(client_id=1, request_id=2, budget_us=2**32 - 1)),
    ("move", dict(src=2, client_id=9, request_id=11, reply=REPLY, task_type=1,
                  service_ns=5, send_ns=-3, payload=b"x" * 1024, origin=2, flags=1, seq=0,
                  budget_us=12345)),
    ("move", dict(src=1, client_id=9, request_id=12, reply=REPLY, flags=3, seq=77,
                  steal_reply=True)),
    ("steal_request", dict(src=3, seq=4, sent_ns=99)),
    ("steal_empty", dict(src=3, seq=4)),
    ("response", dict(src=1, client_id=5, request_id=6, task_type=2, send_ns=7,
                      service_ns=8, load=12.5, queue_len=3, server=1, status=4, flags=2,
                      payload=b"out")),
    ("heartbeat", dict(src=5, seq=9, sent_ns=10, load=1.5, queue_len=2.0, rate=1e-4,
                       migrations=11, steals=12, theta=[0.5, -1.25, 3.0])),
    ("heartbeat", dict(src=0, theta=[float(i) for i in range(256)])),
    ("heartbeat", dict(src=2, seq=1, load=0.5, rate=2e-5, svc_lg=wire.MAX_SVC_LG)),
]


KEY = bytes(range(100, 116))


def _encode(mod, kind, kw, key=None):
    return getattr(mod, f"encode_{kind}")(**kw, key=key, epoch=0x1234_5678_9ABC, auth_seq=42)


def _reseal(m, key=None):
    """The message with its MAC recomputed: a mutation that reaches the decoders' checks."""
    m = bytes(m)
    return m[:-8] + struct.pack("<Q", wire.siphash24(key or bytes(16), m[:-8]))


@pytest.mark.parametrize("key", [None, KEY])
@pytest.mark.parametrize("kind,kw", SAMPLES)
def test_native_and_reference_encoders_agree(kind, kw, key):
    py = _encode(wire, kind, kw, key)
    nat = _encode(native, kind, kw, key)
    assert py == nat
    d_py, d_nat = wire.decode(py, key), native.decode(nat, key)
    assert d_py == d_nat
    assert d_nat["length"] == len(nat)
    assert (d_nat["epoch"], d_nat["auth_seq"]) == (0x1234_5678_9ABC, 42)
    # under another key, both refuse it with the same reason
    other = None if key else KEY
    assert _code(nat, other)[1] == _code_py(nat, other)[1] == "bad MAC"


def test_destination_keys_agree_and_differ():
    """What servers send each other goes under the destination's own key: the reference
    and the native derivation agree, and no two destinations (nor the rack key) share one."""
    for key in (KEY, bytes(16), bytes(range(200, 216))):
        keys = [wire.dst_key(key, j) for j in (0, 1, 2, 63, 65535)]
        assert keys == [native.dst_key(key, j) for j in (0, 1, 2, 63, 65535)]
        assert len(set(keys + [key])) == 6 and all(len(k) == 16 for k in keys)
    with pytest.raises(ValueError, match="0..65535"):
        native.dst_key(KEY, 65536)
    # no rack key: the gateway derives nothing (peer_keys are the all-zero key), nor do these
    assert wire.dst_key(None, 3) is None and native.dst_key(None, 3) is None


def test_decoded_fields_round_trip():
    d = native.decode(native.encode_task(7, 2**63 + 1, 65535, 2**62, -5, b"\0\xff"))
    assert (d["client_id"], d["request_id"], d["task_type"], d["service_ns"], d["send_ns"],
            d["payload"]) == (7, 2**63 + 1, 65535, 2**62, -5, b"\0\xff")
    assert d["src"] == wire.CLIENT_SRC and d["kind"] == "task"
    hb = native.decode(native.encode_heartbeat(3, theta=[1.0, 2.0], load=4.0))
    assert hb["theta"] == [1.0, 2.0] and hb["src"] == 3 and hb["load"] == 4.0
    mv = native.decode(native.encode_move(1, 2, 3, REPLY, steal_reply=True, flags=2, seq=8))
    assert mv["kind"] == "steal_reply" and not mv["empty"] and mv["reply"] == REPLY
    assert native.decode(native.encode_steal_empty(1, 8, epoch=5, auth_seq=6)) == {
        "kind": "steal_reply", "src": 1, "length": 16 + wire.AUTH_LEN, "seq": 8,
        "empty": True, "epoch": 5, "auth_seq": 6}


def test_the_clients_deadline_travels_in_a_task_and_a_move():
    """Wire version 3: a task carries its client's deadline as a relative budget (µs), and a
    forwarded or stolen task what is left of it; a version-2 task is refused."""
    assert wire.VERSION >= 3
    t = native.encode_task(7, 8, budget_us=250_000)
    assert len(t) == 48 + wire.AUTH_LEN
    assert native.decode(t)["budget_us"] == wire.decode(t)["budget_us"] == 250_000
    assert native.decode(native.encode_task(7, 8))["budget_us"] == 0      # none
    m = native.encode_move(1, 2, 3, REPLY, budget_us=99, origin=4, flags=1, seq=5)
    assert len(m) == 80 + wire.AUTH_LEN
    d = native.decode(m)
    assert (d["budget_us"], d["origin"], d["flags"], d["seq"], d["reply"]) == \
        (99, 4, 1, 5, REPLY)
    old = bytearray(t)
    old[2] = 2
    assert _code(_reseal(old))[1] == _code_py(_reseal(old))[1] == "unsupported version"


def test_a_heartbeat_carries_the_delay_its_sender_measured_from_the_destination():
    """Wire version 4: ``echo_ns`` (i64 at 64), what the sender's clock read when it took
    in the destination's last heartbeat less that heartbeat's ``sent_ns``: negative where
    the destination's clock is ahead. Both codecs agree byte for byte; a version-3
    heartbeat is refused."""
    for echo in (0, 1, -5_000_000_000_000, 2**62):
        kw = dict(seq=3, sent_ns=7, load=1.0, theta=[0.5, 0.25], echo_ns=echo, epoch=5,
                  auth_seq=6)
        b = native.encode_heartbeat(2, **kw)
        assert b == wire.encode_heartbeat(2, **kw)
        assert native.decode(b)["echo_ns"] == wire.decode(b)["echo_ns"] == echo
        assert native.decode(b)["theta"] == [0.5, 0.25]
    old = bytearray(native.encode_heartbeat(2, seq=3))
    old[2] = 3
    assert _code(_reseal(old))[1] == _code_py(_reseal(old))[1] == "unsupported version"


def test_a_heartbeat_says_its_senders_window():
    """Wire version 5: ``window_us`` (u32 at 72, then a u32 0; theta at 80), the sender's
    window after it, so when its next heartbeat is due (a quiet rack's are long: the
    receivers suspect it only after 3 of them). Both codecs agree byte for byte, refuse a
    window over 60 s or a non-zero reserved word, and a version-4 heartbeat."""
    assert wire.VERSION == 5
    for win in (0, 100, 5000, wire.MAX_HB_WINDOW_US):
        kw = dict(seq=3, sent_ns=7, theta=[0.5, 0.25], echo_ns=-9, window_us=win, epoch=5,
                  auth_seq=6)
        b = native.encode_heartbeat(2, **kw)
        assert b == wire.encode_heartbeat(2, **kw)
        assert len(b) == 80 + 16 + wire.AUTH_LEN
        assert native.decode(b)["window_us"] == wire.decode(b)["window_us"] == win
        assert native.decode(b)["echo_ns"] == -9 and native.decode(b)["theta"] == [0.5, 0.25]
    for enc in (native.encode_heartbeat, wire.encode_heartbeat):
        with pytest.raises((ValueError, OverflowError)):
            enc(2, window_us=wire.MAX_HB_WINDOW_US + 1)
    for off, value in ((72, wire.MAX_HB_WINDOW_US + 1), (76, 1)):
        bad = bytearray(native.encode_heartbeat(2, seq=3, window_us=100))
        struct.pack_into("<I", bad, off, value)
        assert _code(_reseal(bad))[1] == _code_py(_reseal(bad))[1] == "field out of range"
    old = bytearray(native.encode_heartbeat(2, seq=3))
    old[2] = 4
    assert _code(_reseal(old))[1] == _code_py(_reseal(old))[1] == "unsupported version"


def _code(data, key=None):
    try:
        native.decode(data, key)
    except native.BadMessage as e:
        return e.code, e.reason
    return 0, "ok"


def _code_py(data, key=None):
    try:
        wire.decode(data, key)
    except wire.BadMessage as e:
        return e.code, e.reason
    return 0, "ok"


def test_specific_rejections_have_reasons():
    task = native.encode_task(1, 2, payload=b"hello")
    assert _code(b"")[1] == "shorter than a header"
    assert _code(task[:7])[1] == "shorter than a header"
    assert _code(b"XX" + task[2:])[1] == "bad magic"
    assert _code(task[:2] + b"\x01" + task[3:])[1] == "unsupported version"   # version 1
    assert _code(task[:3] + b"\x09" + task[4:])[1] == "unknown message kind"
    assert _code(task[:-1])[1] == "length does not match"            # truncated
    assert _code(task + b"\0")[1] == "length does not match"          # trailing bytes
    # any changed byte fails the MAC
    bad = bytearray(task)
    bad[20] ^= 1
    assert _code(bytes(bad))[1] == "bad MAC"
    bad = bytearray(task)
    bad[-1] ^= 0x80
    assert _code(bytes(bad))[1] == "bad MAC"
    # resealed (as a holder of the key could): the decoders' own checks
    # header length consistent with the bytes, but the payload length field lies
    bad = bytearray(task)
    struct.pack_into("<H", bad, 14, 9)
    assert _code(_reseal(bad))[1] == "length does not match"
    struct.pack_into("<H", bad, 14, 2000)
    assert _code(_reseal(bad))[1] == "payload too large"
    neg = native.encode_task(1, 2, service_ns=-1)
    assert _code(neg)[1] == "field out of range"
    hb = bytearray(native.encode_heartbeat(1, load=1.0))
    struct.pack_into("<d", hb, 24, math.nan)
    assert _code(_reseal(hb))[1] == "field out of range"
    struct.pack_into("<d", hb, 24, -1.0)
    assert _code(_reseal(hb))[1] == "field out of range"
    hb = bytearray(native.encode_heartbeat(1))
    struct.pack_into("<H", hb, 12, 300)
    assert _code(_reseal(hb))[1] == "too many critic parameters"
    hb = bytearray(native.encode_heartbeat(1, svc_lg=12))
    assert native.decode(bytes(hb))["svc_lg"] == 12
    struct.pack_into("<H", hb, 14, wire.MAX_SVC_LG + 1)              # a speed code too large
    assert _code(_reseal(hb))[1] == _code_py(_reseal(hb))[1] == "field out of range"
    resp = bytearray(native.encode_response(1, 2, 3))
    resp[54] = 9                                                       # no such status
    assert _code(_reseal(resp))[1] == "field out of range"


def test_encoders_refuse_oversized_input():
    with pytest.raises(ValueError):
        native.encode_task(1, 1, payload=b"x" * 1025)
    with pytest.raises(ValueError):
        wire.encode_task(1, 1, payload=b"x" * 1025)
    with pytest.raises(ValueError):
        native.encode_heartbeat(1, theta=[0.0] * 257)
    for enc in (native.encode_heartbeat, wire.encode_heartbeat):
        with pytest.raises(ValueError, match="svc_lg"):
            enc(1, svc_lg=wire.MAX_SVC_LG + 1)


def test_fuzzed_input_is_rejected_identically_and_never_crashes():
    rng = random.Random(1234)
    seeds = [_encode(native, k, kw) for k, kw in SAMPLES]
    n_bad = 0
    for i in range(4000):
        m = bytearray(rng.choice(seeds))
        op = i % 4
        if op == 0:
            m = m[:rng.randrange(len(m) + 1)]
        elif op == 1:
            for _ in range(rng.randrange(1, 4)):
                m[rng.randrange(len(m))] = rng.randrange(256)
        elif op == 2:
            m += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        else:
            m = bytearray(rng.randrange(256) for _ in range(rng.randrange(0, 120)))
        data = bytes(m)
        if i % 8 < 4 and len(data) >= 8 + wire.AUTH_LEN:
            # half with a valid MAC and header length (as a key holder could send), so
            # the mutations reach the body's checks
            data = data[:6] + struct.pack("<H", len(data)) + data[8:]
            data = _reseal(data)
        c_nat, c_py = _code(data), _code_py(data)
        assert c_nat[0] == c_py[0], (data.hex(), c_nat, c_py)
        assert native.check(data) == c_nat[0]
        n_bad += c_nat[0] != 0
        if c_nat[0] == 0:
            assert native.decode(data) == wire.decode(data)
    assert n_bad > 2000          # the mutations do hit the checks


def test_error_names_are_total():
    assert native.error_name(-1) == "shorter than a header"
    assert native.error_name(-10) == "sender address outside the rack"
    assert native.error_name(-12) == "bad MAC"
    assert native.error_name(-15) == "stale heartbeat"
    assert native.error_name(-16) == "unknown error"
    assert native.error_name(-99) == "unknown error"
    assert native.error_name(5) == "unknown error"
