"""The verbs transport's first batch to a new peer (issue 13 item 6), many times over.

    scripts/rdma-vm -- python3 bench/verbs_first_batch.py --rounds 200

Each round opens two fresh verbs endpoints in this process, starts a busy-polling echo on one
(:func:`malcolm.bench.transport.transport_echo`, in a thread without the GIL) and sends it a
first batch of ``--batch`` messages from the other, at once: the sender resolves the new
peer's address (a query to its address thread), then posts the whole batch. Every message
must come back. A busy-polling receiver makes the race that lost first batches likely: the
address thread answering the query before it queued the sender's introduction, so that the
batch arrived before the introduction and was dropped as ``unknown_src``. Prints one line
per failed round and a total; exits 1 when any message was lost.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402


def one_round(open_transport, transport_echo, host, batch):
    """Echoed count, and the echo side's ``unknown_src``, for one fresh pair."""
    a = open_transport("verbs", f"{host}:0")
    b = open_transport("verbs", f"{host}:0")
    try:
        echo = threading.Thread(target=transport_echo, args=(b, 10.0, batch))
        echo.start()
        a.send_many([(b.address, f"m{i}".encode()) for i in range(batch)])
        got = []
        t_end = time.monotonic() + 5.0
        while len(got) < batch and time.monotonic() < t_end:
            got += a.recv(0.1)
        echo.join(15)
        return len(got), b.stats()["unknown_src"]
    finally:
        a.close()
        b.close()


def main(argv=None):
    ap = g.parser(__doc__, examples="""
  scripts/rdma-vm -- python3 bench/verbs_first_batch.py --rounds 200
  scripts/rdma-vm -- python3 bench/verbs_first_batch.py --rounds 50 --batch 64""")
    ap.add_argument("--rounds", type=int, default=200,
                    help="fresh endpoint pairs to try (200)")
    ap.add_argument("--batch", type=int, default=20,
                    help="messages in each first batch (20)")
    ap.add_argument("--host", default=os.environ.get("MALCOLM_RDMA_HOST", "10.77.0.1"),
                    help="the RDMA device's address ($MALCOLM_RDMA_HOST, else 10.77.0.1)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.batch < 1:
        ap.error("--rounds and --batch must be >= 1")
    from malcolm.bench.transport import transport_echo
    from malcolm.net.transport import open_transport

    lost = failed = 0
    t0 = time.monotonic()
    for r in range(args.rounds):
        n, unknown = one_round(open_transport, transport_echo, args.host, args.batch)
        if n < args.batch:
            failed += 1
            lost += args.batch - n
            print(f"round {r}: {n} of {args.batch} echoed (echo side unknown_src {unknown})",
                  flush=True)
    print(f"verbs first batch: {args.rounds} rounds of {args.batch}, {failed} rounds lost "
          f"messages, {lost} of {args.rounds * args.batch} lost "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
