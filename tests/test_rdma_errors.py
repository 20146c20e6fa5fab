"""The verbs transport refuses to start without pyverbs, its extension or a device, and says
how to fix it. These run everywhere (no RDMA needed): the missing parts are simulated."""

import sys
import types

import pytest

from malcolm.net import verbs


def test_missing_pyverbs_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    monkeypatch.setitem(sys.modules, "pyverbs.addr", None)
    with pytest.raises(verbs.VerbsUnavailable, match="apt-get install python3-pyverbs"):
        verbs.require()


def test_missing_extension_names_the_build(monkeypatch):
    import malcolm.net

    monkeypatch.setitem(sys.modules, "malcolm.net._verbs", None)
    monkeypatch.delattr(malcolm.net, "_verbs", raising=False)
    with pytest.raises(verbs.VerbsUnavailable, match="libibverbs-dev"):
        verbs._native()
    with pytest.raises(verbs.VerbsUnavailable, match="libibverbs-dev"):
        verbs.VerbsTransport


def test_no_device_names_rdma_rxe(monkeypatch):
    fake = types.SimpleNamespace(get_device_list=lambda: [])
    monkeypatch.setattr(verbs, "_pyverbs", lambda: (None, None, fake, None, None, None, None))
    with pytest.raises(verbs.VerbsUnavailable, match="rdma link add rxe0"):
        verbs.list_devices(require_one=True)
    with pytest.raises(verbs.VerbsUnavailable, match="no RDMA device"):
        verbs.Endpoint()


def test_address_round_trip_and_bounds():
    a = verbs.Address(bytes(range(16)), 0x1234, 0x11111111)
    assert len(a.pack()) == verbs.Address.SIZE
    assert verbs.Address.unpack(a.pack()) == a
    with pytest.raises(ValueError):
        verbs.Address.unpack(a.pack()[:-1])
    with pytest.raises(ValueError):
        verbs.Address.unpack(bytes(16) + bytes(8))
