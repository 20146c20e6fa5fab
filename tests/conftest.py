"""Fixtures that more than one test module uses."""

import os
import platform
import shutil
import subprocess

import pytest
from malcolm.net.transport import open_transport
from test_transport import PARAMS, _addr


@pytest.fixture(params=PARAMS)
def pair(request):
    """Two endpoints of one transport, for every transport the suite runs (verbs only under
    ``-m rdma``, in the Soft-RoCE guest): the transport suite and the delay stage's tests."""
    kind = request.param
    a = open_transport(kind, _addr(kind))
    b = open_transport(kind, _addr(kind))
    yield kind, a, b
    a.close()
    b.close()


@pytest.fixture
def c_program(tmp_path):
    """Build a C program against ``malcolm/``'s headers and run it: the kernel tests'
    equivalence checks. ``c_program(source, name, flags=(), opt="-O3")`` returns the run's
    ``CompletedProcess`` (text output). The package's flags (setup.py) without ``-march``;
    skipped without gcc on x86-64 (the kernels use GCC vector extensions and clones)."""
    cc = shutil.which("gcc")
    if cc is None or platform.machine() != "x86_64":
        pytest.skip("needs gcc on x86-64 (GCC vector extensions and target_clones)")
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "malcolm")

    def run(source, name, flags=(), opt="-O3"):
        src = tmp_path / f"{name}.c"
        src.write_text(source)
        exe = tmp_path / name
        built = subprocess.run([cc, opt, "-fno-math-errno", "-fno-trapping-math", *flags,
                                "-I", inc, str(src), "-o", str(exe), "-lm"],
                               capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr[-3000:]
        return subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    return run
