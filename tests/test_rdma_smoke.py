"""pyverbs alone on the RDMA device: the setup the verbs transport builds on.

Runs only under ``pytest -m rdma`` (``scripts/rdma-vm`` boots a Soft-RoCE guest for it). A
missing device there is a failure, not a skip.
"""

import os

import pytest

pytestmark = pytest.mark.rdma

QKEY = 0x11111111
GRH = 40
N = 8
SIZE = 64


@pytest.fixture
def ctx():
    from pyverbs.device import Context, get_device_list

    names = [d.name.decode() for d in get_device_list()]
    assert names, "no RDMA device: run these tests with scripts/rdma-vm"
    ctx = Context(name=os.environ.get("MALCOLM_RDMA_DEVICE", names[0]))
    yield ctx
    ctx.close()


def test_device_port_and_gid(ctx):
    import pyverbs.enums as e

    from malcolm.net.verbs import pick_gid

    attr = ctx.query_device()
    assert attr.max_qp > 0 and attr.max_cqe > 0
    port = ctx.query_port(1)
    assert port.state == e.IBV_PORT_ACTIVE
    assert port.gid_tbl_len > 0
    idx, gid = pick_gid(ctx, 1)
    assert len(gid) == 16 and gid != bytes(16)
    # The guest gives dummy0 an IPv4 address, so there is a RoCE v2 IPv4-mapped GID.
    if os.environ.get("MALCOLM_RDMA_DEVICE") == "rxe0":
        assert gid[:12] == bytes(10) + b"\xff\xff"


def _ud_side(ctx, pd, e, cq_mod, mr_mod, qp_mod):
    cq = cq_mod.CQ(ctx, 2 * N, None, None, 0)
    mr = mr_mod.MR(pd, N * (GRH + SIZE), e.IBV_ACCESS_LOCAL_WRITE)
    init = qp_mod.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                             cap=qp_mod.QPCap(max_send_wr=N, max_recv_wr=N))
    attr = qp_mod.QPAttr(port_num=1)
    attr.qkey = QKEY
    attr.pkey_index = 0
    qp = qp_mod.QP(pd, init, attr)
    assert qp.qp_state == e.IBV_QPS_RTS
    return cq, mr, qp


def test_ud_pair_exchanges_messages(ctx):
    import pyverbs.cq as cq_mod
    import pyverbs.enums as e
    import pyverbs.mr as mr_mod
    import pyverbs.qp as qp_mod
    from pyverbs.addr import AH, AHAttr, GlobalRoute
    from pyverbs.pd import PD
    from pyverbs.wr import SGE, RecvWR, SendWR

    from malcolm.net.verbs import pick_gid

    pd = PD(ctx)
    idx, _ = pick_gid(ctx, 1)
    gid = ctx.query_gid(1, idx)
    a = _ud_side(ctx, pd, e, cq_mod, mr_mod, qp_mod)
    b = _ud_side(ctx, pd, e, cq_mod, mr_mod, qp_mod)
    ah = AH(pd, attr=AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=idx),
                            dlid=ctx.query_port(1).lid))

    for src, dst in ((a, b), (b, a)):
        scq, smr, sqp = src
        rcq, rmr, rqp = dst
        for i in range(N):
            rqp.post_recv(RecvWR(wr_id=i, num_sge=1,
                                 sg=[SGE(rmr.buf + i * (GRH + SIZE), GRH + SIZE, rmr.lkey)]))
        for i in range(N):
            msg = bytes([i]) * SIZE
            smr.write(msg, SIZE, i * SIZE)
            wr = SendWR(wr_id=100 + i, opcode=e.IBV_WR_SEND, num_sge=1,
                        sg=[SGE(smr.buf + i * SIZE, SIZE, smr.lkey)])
            wr.set_wr_ud(ah, rqp.qp_num, QKEY)
            sqp.post_send(wr)
        recv_ids, send_ids = [], []
        # The send and receive completions of this direction land on two CQs.
        for _ in range(10000):
            for cq, out in ((scq, send_ids), (rcq, recv_ids)):
                n, wcs = cq.poll(num_entries=N)
                for wc in wcs[:n]:
                    assert wc.status == e.IBV_WC_SUCCESS, wc
                    out.append(wc)
            if len(recv_ids) == N and len(send_ids) == N:
                break
        assert sorted(w.wr_id for w in send_ids) == list(range(100, 100 + N))
        assert sorted(w.wr_id for w in recv_ids) == list(range(N))
        for wc in recv_ids:
            assert wc.byte_len == GRH + SIZE
            assert wc.src_qp == sqp.qp_num
            got = rmr.read(SIZE, wc.wr_id * (GRH + SIZE) + GRH)
            assert got == bytes([wc.wr_id]) * SIZE
    ah.close()
    for cq, mr, qp in (a, b):
        qp.close()
        mr.close()
        cq.close()
    pd.close()
