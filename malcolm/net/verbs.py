"""RDMA verbs endpoints: pyverbs sets them up, :mod:`malcolm.net._ud_queue` moves the data.

An :class:`Endpoint` is one UD queue pair with its completion queues and one registered buffer
(see docs/rdma.md for why UD rather than RC). pyverbs creates every verbs object; the native
:class:`~malcolm.net._ud_queue.UDQueue` borrows their pointers and runs sends, receives and
completion polling without the GIL.

Nothing here falls back to another transport. A missing pyverbs, native extension or RDMA
device raises :class:`VerbsUnavailable` with the fix in its message.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import sys
from dataclasses import dataclass

from malcolm.net.transport import split_host_port

PYVERBS_DIR = "/usr/lib/python3/dist-packages/pyverbs"
DEFAULT_QKEY = 0x11111111
_MTU_BYTES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


class VerbsUnavailable(RuntimeError):
    """The verbs transport cannot run here; the message says what to install or load."""


def _pyverbs():
    try:
        import pyverbs.addr as addr
        import pyverbs.cq as cq
        import pyverbs.device as device
        import pyverbs.enums as enums
        import pyverbs.mr as mr
        import pyverbs.pd as pd
        import pyverbs.qp as qp
    except ImportError as exc:
        hint = ""
        if os.path.isdir(PYVERBS_DIR):
            hint = (f" pyverbs is installed in {PYVERBS_DIR} but this Python does not see it:"
                    " put a folder holding a symlink named pyverbs to it on PYTHONPATH"
                    " (not all of dist-packages), as scripts/rdma-vm does.")
        raise VerbsUnavailable(
            f"the verbs transport needs pyverbs, which cannot be imported ({exc}). Fix: "
            "apt-get install python3-pyverbs (rdma-core 44 or later)." + hint) from exc
    return addr, cq, device, enums, mr, pd, qp


def _native():
    """The native modules ``(_ud_queue, _verbs)``: the UD queue and the transport."""
    try:
        from malcolm.net import _ud_queue, _verbs
    except ImportError as exc:
        raise VerbsUnavailable(
            f"the native verbs data path malcolm.net._verbs is not built ({exc}). Fix: "
            "apt-get install libibverbs-dev, then rebuild with "
            "MALCOLM_ONLY='malcolm.net._ud_queue,malcolm.net._verbs' python3 setup.py "
            "build_ext --inplace") from exc
    return _ud_queue, _verbs


def require():
    """Check that pyverbs, the native extension and an RDMA device are all there.

    Raises
    ------
    VerbsUnavailable
        With the fix in its message.
    """
    _pyverbs()
    _native()
    list_devices(require_one=True)


def list_devices(require_one=False):
    """Names of the RDMA devices that libibverbs sees."""
    device = _pyverbs()[2]
    try:
        devs = device.get_device_list()
    except Exception as exc:  # noqa: BLE001 - PyverbsRDMAError when the kernel has no RDMA
        if not require_one:
            return []
        raise VerbsUnavailable(
            f"cannot list RDMA devices ({exc}): this kernel has no RDMA support loaded. "
            + _NO_DEVICE_FIX) from exc
    names = [d.name.decode() if isinstance(d.name, bytes) else d.name for d in devs]
    if require_one and not names:
        raise VerbsUnavailable("no RDMA device found. " + _NO_DEVICE_FIX)
    return names


_NO_DEVICE_FIX = (
    "Fix: load the adapter's driver (mlx5_ib, say); or for Soft-RoCE as root: modprobe "
    "rdma_rxe && rdma link add rxe0 type rxe netdev <interface>; or run the RDMA tests in "
    "the Soft-RoCE guest with scripts/rdma-vm.")


def split_address(address):
    """``(host, port)`` of a verbs address ``"host:port"``, ``"[v6]:port"`` or a tuple;
    ``(None, 0)`` for ``None``."""
    if address is None:
        return None, 0
    host, port = split_host_port(address, "verbs")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"verbs address {address!r}: want an IP address and a port "
                         "(the RDMA interface's address)") from None
    return str(ip), port


def host_gid(host) -> bytes:
    """The RoCE v2 GID of an IP address: IPv4-mapped for IPv4, the address for IPv6."""
    ip = ipaddress.ip_address(host)
    return ip.packed if ip.version == 6 else bytes(10) + b"\xff\xff" + ip.packed


def seal_control(msg, key, src, dst) -> bytes:
    """A keyed address datagram: the first 56 bytes of ``msg`` (introduction, epoch, nonce,
    cookie) followed by their MAC under the 16-byte ``key`` from ``src`` to ``dst``
    (``(host, port)`` or ``"host:port"``). The Python twin of ``mcv_seal`` in
    ``net/_verbs_ctl.h`` (the format is described there), for tools and for the tests that
    forge one."""
    from malcolm.net.wire import siphash24
    head = bytes(msg[:56])
    return head + struct.pack("<Q", siphash24(bytes(key), head + _canon(src) + _canon(dst)))


def _canon(address) -> bytes:
    """An address as both ends of a control datagram see it: family, port, 16 address bytes
    (no IPv6 scope: it is local to a host)."""
    import socket
    host, port = split_address(address)
    ip = ipaddress.ip_address(host.split("%")[0])
    fam = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    return struct.pack(">HH", fam, port) + ip.packed.ljust(16, b"\0")


def find_device_for_gid(gid, device=None, port=1):
    """``(device, gid_index, gid)``: the device and GID index that hold ``gid``.

    With ``gid=None``, the first device (or ``device``) and its :func:`pick_gid` choice.
    """
    dev = _pyverbs()[2]
    names = list_devices(require_one=True)
    if device is not None and device not in names:
        raise VerbsUnavailable(f"no RDMA device named {device!r} (have {names})")
    for name in [device] if device else names:
        ctx = dev.Context(name=name)
        try:
            if gid is None:
                idx, raw = pick_gid(ctx, port)
                return name, idx, raw
            for i in range(ctx.query_port(port).gid_tbl_len):
                try:
                    if _gid_bytes(ctx.query_gid(port, i)) == gid:
                        return name, i, gid
                except Exception:  # noqa: BLE001 - unpopulated entries raise
                    continue
        finally:
            ctx.close()
    shown = str(ipaddress.ip_address(gid[12:] if gid[:12] == bytes(10) + b"\xff\xff" else gid))
    raise VerbsUnavailable(
        f"no RDMA device has the GID of {shown} on port {port} (devices: {names}). Fix: "
        "listen on an IP address of the RDMA device's network interface (for Soft-RoCE: "
        "the netdev given to `rdma link add`).")


def __getattr__(name):
    # The transport class lives in the native module; importing it lazily keeps this module
    # importable (for its clear errors) where the extension is not built.
    if name == "VerbsTransport":
        return _native()[1].VerbsTransport
    raise AttributeError(name)


def _gid_bytes(gid) -> bytes:
    return bytes.fromhex(str(gid).replace(":", ""))


def _gid_str(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def pick_gid(ctx, port=1):
    """Index and bytes of the GID to use: an IPv4-mapped one (RoCE v2) if any, else the first.

    RoCE v2 over IPv4 routes across subnets, which the link-local GID at index 0 does not.
    """
    tbl = ctx.query_port(port).gid_tbl_len
    first = None
    for i in range(tbl):
        try:
            raw = _gid_bytes(ctx.query_gid(port, i))
        except Exception:  # noqa: BLE001 - unpopulated entries raise on some providers
            continue
        if raw == bytes(16):
            continue
        if raw[:12] == bytes(10) + b"\xff\xff":
            return i, raw
        if first is None:
            first = (i, raw)
    if first is None:
        raise VerbsUnavailable(f"port {port} of the RDMA device has no usable GID. Fix: give "
                               "its network interface an IP address and bring it up.")
    return first


@dataclass(frozen=True)
class Address:
    """What a peer needs to reach an endpoint: GID, UD QP number and Q_Key.

    ``pack`` gives 24 bytes (GID, then QP number and Q_Key in network order) to exchange out
    of band, in the rack file or over another transport.
    """

    gid: bytes
    qpn: int
    qkey: int = DEFAULT_QKEY

    SIZE = 24

    def pack(self) -> bytes:
        return self.gid + struct.pack("!II", self.qpn, self.qkey)

    @classmethod
    def unpack(cls, data: bytes) -> Address:
        if len(data) != cls.SIZE:
            raise ValueError(f"a verbs address is {cls.SIZE} bytes, got {len(data)}")
        qpn, qkey = struct.unpack("!II", data[16:])
        if qpn == 0 or qpn >= 1 << 24:
            raise ValueError(f"bad QP number {qpn} in a verbs address")
        return cls(bytes(data[:16]), qpn, qkey)


class Endpoint:
    """One UD queue pair with its CQs and registered buffers, ready for the nogil data path.

    Parameters
    ----------
    device : str, optional
        RDMA device name; default ``$MALCOLM_RDMA_DEVICE`` or the first device.
    port : int
        Port number on the device.
    n_recv, n_send : int
        Receive and send slots (each is a posted work request at most).
    payload : int, optional
        Largest message in bytes; default and maximum: the port's active MTU.
    max_inline : int
        Ask for inline sends up to this size (0 when the device refuses).
    qkey : int
        Q_Key shared by the rack.
    gid_index : int, optional
        Source GID; default: :func:`pick_gid`.
    channel : bool
        Give the receive CQ a completion channel (for blocking waits).

    Attributes
    ----------
    queue : malcolm.net._ud_queue.UDQueue
        The native data path.
    address : Address
        This endpoint's address, for its peers.
    """

    def __init__(self, device=None, port=1, n_recv=512, n_send=256, payload=None,
                 max_inline=64, qkey=DEFAULT_QKEY, gid_index=None, channel=False):
        addr, cq, dev, e, mr, pd, qp = _pyverbs()
        names = list_devices(require_one=True)
        native = _native()[0]
        device = device or os.environ.get("MALCOLM_RDMA_DEVICE") or names[0]
        if device not in names:
            raise VerbsUnavailable(f"no RDMA device named {device!r} (have {names}). Fix: "
                                   "pick one of those, or set MALCOLM_RDMA_DEVICE.")
        self.ctx = dev.Context(name=device)
        self.port = port
        pattr = self.ctx.query_port(port)
        if pattr.state != e.IBV_PORT_ACTIVE:
            raise VerbsUnavailable(f"port {port} of {device} is not active. Fix: bring its "
                                   "network interface (or InfiniBand link) up.")
        self.lid = pattr.lid
        mtu = _MTU_BYTES.get(int(pattr.active_mtu), 1024)
        payload = mtu if payload is None else min(payload, mtu)
        if payload <= 0:
            raise ValueError("payload must be positive")
        if gid_index is None:
            self.gid_index, gid = pick_gid(self.ctx, port)
        else:
            self.gid_index, gid = gid_index, _gid_bytes(self.ctx.query_gid(port, gid_index))
        self.pd = pd.PD(self.ctx)
        self.channel = cq.CompChannel(self.ctx) if channel else None
        self.scq = cq.CQ(self.ctx, n_send, None, None, 0)
        self.rcq = cq.CQ(self.ctx, n_recv, None, self.channel, 0)
        grh = native.GRH_BYTES
        length = n_recv * (grh + payload) + n_send * payload
        self.mr = mr.MR(self.pd, length, e.IBV_ACCESS_LOCAL_WRITE)
        self.qp = None
        for inline in dict.fromkeys((max_inline, 0)):
            cap = qp.QPCap(max_send_wr=n_send, max_recv_wr=n_recv, max_send_sge=1,
                           max_recv_sge=1, max_inline_data=inline)
            init = qp.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.scq, rcq=self.rcq, cap=cap)
            attr = qp.QPAttr(port_num=port)
            attr.qkey = qkey
            attr.pkey_index = 0
            try:
                self.qp = qp.QP(self.pd, init, attr)
                break
            except Exception:
                if inline == 0:
                    raise
        self.max_inline = inline
        self.qkey = qkey
        self.address = Address(gid, self.qp.qp_num, qkey)
        self._addr_mod = addr
        self._ahs = []
        self.queue = native.UDQueue(
            self.qp, self.scq, self.rcq, self.mr.buf, self.mr.lkey, length, n_recv, n_send,
            payload, inline, keep=(self.ctx, self.pd, self.scq, self.rcq, self.mr, self.qp),
            pd=self.pd, port_num=port, sgid_index=self.gid_index)

    def connect(self, peer: Address) -> int:
        """Create an address handle to ``peer``; returns its index for ``queue.send``."""
        a = self._addr_mod
        gr = a.GlobalRoute(dgid=a.GID(_gid_str(peer.gid)), sgid_index=self.gid_index)
        ah_attr = a.AHAttr(port_num=self.port, is_global=1, gr=gr, dlid=self.lid)
        ah = a.AH(self.pd, attr=ah_attr)
        self._ahs.append(ah)
        return self.queue.add_peer(ah, peer.qpn, peer.qkey, peer.gid)

    def close(self):
        """Destroy the verbs objects (the queue first: it borrows their pointers)."""
        if getattr(self, "ctx", None) is None:
            return
        if getattr(self, "queue", None) is not None:
            self.queue.close()
        self.queue = None
        for ah in getattr(self, "_ahs", ()):
            ah.close()
        self._ahs = []
        for name in ("qp", "mr", "scq", "rcq", "channel", "pd", "ctx"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
        self.ctx = None

    def __del__(self):
        # Close in order (queue first) rather than leave it to pyverbs' deallocators, which
        # would find the PD still holding address handles.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at interpreter exit
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _main(argv=None):
    """``python3 -m malcolm.net.verbs devices``: the RDMA devices and the GID each would use.

    The transport ping-pong (``echo`` / ``ping``, for verbs and every other transport) is
    ``python3 -m malcolm.bench.pingpong`` (docs/rdma.md, "Performance").
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python3 -m malcolm.net.verbs", description=_main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("devices", help="list RDMA devices and the GID each would use")
    ap.parse_args(argv)
    try:
        dev = _pyverbs()[2]
        for name in list_devices(require_one=True):
            ctx = dev.Context(name=name)
            idx, gid = pick_gid(ctx)
            print(f"{name}: GID index {idx} {_gid_str(gid)}")
            ctx.close()
    except VerbsUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
