"""The verbs transport refuses to start without pyverbs, its extension or a device, and says
how to fix it. These run everywhere (no RDMA needed): the missing parts are simulated."""

import os
import subprocess
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
        _ = verbs.VerbsTransport


def test_no_device_names_rdma_rxe(monkeypatch):
    fake = types.SimpleNamespace(get_device_list=lambda: [])
    monkeypatch.setattr(verbs, "_pyverbs", lambda: (None, None, fake, None, None, None, None))
    with pytest.raises(verbs.VerbsUnavailable, match="rdma link add rxe0"):
        verbs.list_devices(require_one=True)
    with pytest.raises(verbs.VerbsUnavailable, match="no RDMA device"):
        verbs.Endpoint()


def test_kernel_without_rdma_names_the_fix(monkeypatch):
    def fail():
        raise RuntimeError("Failed to get devices list")      # what pyverbs raises then

    fake = types.SimpleNamespace(get_device_list=fail)
    monkeypatch.setattr(verbs, "_pyverbs", lambda: (None, None, fake, None, None, None, None))
    # The native extension is checked before the kernel: stand it in, so that the test does
    # not depend on whether this machine could build it (no libibverbs-dev on a fresh one).
    monkeypatch.setattr(verbs, "_native", lambda: object())
    assert verbs.list_devices() == []
    with pytest.raises(verbs.VerbsUnavailable, match="no RDMA support.*modprobe rdma_rxe"):
        verbs.require()


def test_address_round_trip_and_bounds():
    a = verbs.Address(bytes(range(16)), 0x1234, 0x11111111)
    assert len(a.pack()) == verbs.Address.SIZE
    assert verbs.Address.unpack(a.pack()) == a
    with pytest.raises(ValueError):
        verbs.Address.unpack(a.pack()[:-1])
    with pytest.raises(ValueError):
        verbs.Address.unpack(bytes(16) + bytes(8))


SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "scripts", "rdma-vm")


def _run_script(*args, **env):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **env))


def test_rdma_vm_missing_qemu_fails_clearly_unless_told_to_skip():
    r = _run_script("--no-install", RDMA_VM_QEMU="/nonexistent/qemu")
    assert r.returncode == 3, r.stderr
    assert "qemu-system-x86" in r.stderr and "apt-get install" in r.stderr
    r = _run_script("--no-install", "--skip-if-missing", RDMA_VM_QEMU="/nonexistent/qemu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("MALCOLM-VM-SKIP") and "qemu-system-x86" in r.stdout


def test_rdma_vm_help_and_bad_option():
    assert _run_script("--help").returncode == 0
    r = _run_script("--frobnicate")
    assert r.returncode == 2 and "unknown option" in r.stderr
