"""Long fuzzing run of the wire decoder and the heartbeat path (issue 13, item 8).

    .venv/bin/python bench/fuzz_wire.py --inputs 1000000 --server-inputs 200000

Stage 1 (decoder): hypothesis draws a base message (every kind, signed with a rack key), a
mutation recipe and a seed; each example expands into ``--batch`` inputs (truncations, byte
flips, appended bytes, random bytes; half resealed with a valid MAC and header length, as a
holder of the key could send), each decoded natively, and every ``--check-every``-th also by
the pure-Python reference, which must agree on the code and the fields. Any exception other
than ``BadMessage`` is a failure.

Stage 2 (heartbeat path): a live keyed server (policy ``malcolm`` if built) gets
``--server-inputs`` datagrams from a member's address: the same mutations, and validly
signed heartbeats with arbitrary finite loads and critic parameters. It must keep serving (a
client's tasks are all answered or were migrated to the silent test peer) and count each
datagram.

Prints one JSON object with the counts, the rates and the failures (expected: none).
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from malcolm import _argparse as g
from malcolm.net import _wire as native
from malcolm.net import wire

# The keys, the seed messages, the resealing and the decode wrapper are the test suite's
# (tests/test_security_fuzz.py): this is the same fuzzing, longer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from test_security_fuzz import KEY, _code, _reseal, _seeds  # noqa: E402


def seeds():
    """The test suite's seeds, and a heartbeat with the most critic parameters (256)."""
    return _seeds() + [native.encode_heartbeat(1, 2, 3, 1.0, 2.0, 1e-4, 4, 5, [1.0] * 256,
                                               key=KEY, epoch=5, auth_seq=9)]


def reseal(m):
    return _reseal(m[:-24] if len(m) > 24 else m, KEY, native.siphash24)


def mutate(rng, base, flips, cut_frac, tail):
    op = rng.randrange(5)
    m = bytearray(base)
    if op == 0:
        m = m[:int(len(m) * cut_frac)]
    elif op in (1, 2):
        for _ in range(flips):
            if m:
                m[rng.randrange(len(m))] = rng.randrange(256)
    elif op == 3:
        m += bytes(rng.randrange(256) for _ in range(tail))
    else:
        m = bytearray(rng.getrandbits(8) for _ in range(rng.randrange(0, 160)))
    data = bytes(m)
    return reseal(data) if rng.random() < 0.5 else data


def stage_decoder(n_inputs, batch, check_every):
    stats = collections.Counter()
    failures = []
    base = seeds()
    count = [0]
    n_examples = max(1, n_inputs // batch)

    @settings(max_examples=n_examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(st.integers(0, len(base) - 1), st.integers(1, 8), st.floats(0, 1),
           st.integers(1, 64), st.integers(0, 2**32))
    def run(i, flips, cut_frac, tail, seed):
        rng = random.Random(seed)
        for _ in range(batch):
            data = mutate(rng, base[i], flips, cut_frac, tail)
            count[0] += 1
            try:
                code, d = _code(native.decode, data, KEY)
            except Exception as e:          # anything but BadMessage is a bug
                failures.append(("native raised", repr(e), data.hex()))
                continue
            stats[native.error_name(code) if code else "ok"] += 1
            if count[0] % check_every == 0:
                code_py, d_py = _code(wire.decode, data, KEY)
                if code_py != code or (code == 0 and repr(d) != repr(d_py)):
                    failures.append(("reference disagrees", code, code_py, data.hex()))

    t0 = time.perf_counter()
    run()
    dt = time.perf_counter() - t0
    return {"inputs": count[0], "seconds": dt, "per_s": count[0] / dt,
            "reference_checked": count[0] // check_every, "outcomes": dict(stats),
            "failures": failures[:20], "n_failures": len(failures)}


def stage_server(n_inputs):
    from malcolm.net.transport import open_transport
    from malcolm.runtime.server import Server

    from malcolm.net.client import Client
    from malcolm.policy.registry import make_policy
    try:
        pol = make_policy("malcolm", 2, 0, 1)
    except ValueError:
        pol = make_policy("jsq", 2, 0, 1)
    tr = open_transport("udp", "127.0.0.1:0")
    peer = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address, peer.address], 0, pol, handler="echo", window_us=1000,
                 key=KEY).start()
    rng = random.Random(7)
    base = seeds()
    sent, t0 = 0, time.perf_counter()
    lost = answered = forwards = 0

    def probe():
        nonlocal lost, answered, forwards
        with Client("udp", [tr.address], key=KEY) as c:
            acc = c.run(20, service_ns=0, rate=5000, timeout=1.0)
        lost += acc.lost
        answered += len(acc.answered)
        time.sleep(0.05)
        for d, _ in peer.recv(0.05):
            forwards += d[3] == wire.Kind.FORWARD
    try:
        while sent < n_inputs:
            burst = []
            for _ in range(256):
                if rng.random() < 0.5:
                    theta = [rng.choice((1e308, -1e308, 1e-300, rng.uniform(-1e6, 1e6)))
                             for _ in range(rng.randrange(0, 65))]
                    burst.append(wire.encode_heartbeat_native(
                        1, seq=rng.getrandbits(32), load=rng.choice((0.0, 1e308, 5e4)),
                        queue_len=rng.uniform(0, 1e9), rate=rng.uniform(0, 1.0),
                        theta=theta, key=KEY))
                else:
                    burst.append(mutate(rng, rng.choice(base), rng.randrange(1, 8),
                                        rng.random(), rng.randrange(1, 64)))
            peer.send_many([(tr.address, m) for m in burst])
            sent += len(burst)
            for d, _ in peer.recv(0.0):
                forwards += d[3] == wire.Kind.FORWARD
            if sent % 12_800 < 256:           # now and then: is it still serving?
                probe()
        dt = time.perf_counter() - t0
        probe()
        time.sleep(0.5)
        s = srv.stats()
    finally:
        rep = srv.stop()
        peer.close()
    outcome = {k: s[k] for k in ("rx_msgs", "hb_recv", "hb_stale", "hb_dropped",
                                 "forwarded_in", "bad_input", "steal_req_recv",
                                 "steal_empty_recv", "stolen_in", "malformed")}
    return {"datagrams": sent, "seconds": dt, "per_s": sent / dt, "server": outcome,
            "malformed_by_reason": s["malformed_by_reason"],
            "probe_tasks_answered": answered, "probe_tasks_lost": lost,
            "forwards_to_silent_peer": forwards, "send_failed": s["send_failed"],
            "stuck_threads": rep["stuck_threads"]}


def main(argv=None):
    ap = g.parser(__doc__, """
        .venv/bin/python bench/fuzz_wire.py --inputs 1000000 --server-inputs 300000
        .venv/bin/python bench/fuzz_wire.py --inputs 10000 --server-inputs 0""")
    ap.add_argument("--inputs", type=int, default=1_000_000,
                    help="inputs to the decoder (default 1000000)")
    ap.add_argument("--batch", type=int, default=100,
                    help="inputs per hypothesis example (default 100)")
    ap.add_argument("--check-every", type=int, default=20,
                    help="compare with the Python decoder every Nth input (default 20)")
    ap.add_argument("--server-inputs", type=int, default=200_000,
                    help="datagrams sent to a live server's heartbeat path; 0: none "
                         "(default 200000)")
    a = ap.parse_args(argv)
    out = {"decoder": stage_decoder(a.inputs, a.batch, a.check_every)}
    if a.server_inputs:
        out["heartbeat_path"] = stage_server(a.server_inputs)
    from malcolm._metadata import run_metadata
    print(json.dumps(dict(out, metadata=run_metadata(vars(a))), indent=1, default=str))
    bad = out["decoder"]["n_failures"] or (a.server_inputs and (
        out["heartbeat_path"]["stuck_threads"]
        or out["heartbeat_path"]["probe_tasks_lost"]
        > out["heartbeat_path"]["forwards_to_silent_peer"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
