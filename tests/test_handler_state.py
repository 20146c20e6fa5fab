"""Per-handler state for shared-library and cffi handlers (``SYMBOL_init``/``SYMBOL_fini``, the
``ctx`` of the handler ABI) and the ``MALCOLM_BAD_INPUT`` status
(malcolm/workers/malcolm_handler.h)."""

import gc
import os
import shutil
import subprocess
import sys

import pytest
from malcolm.workers.handlers import Handler

STATEFUL_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "malcolm_handler.h"
typedef struct { int add; char done_path[512]; } state;
void *add_n_init(const char *arg) {          /* arg: "ADD:PATH" */
  state *s = calloc(1, sizeof(state));
  if (!s || sscanf(arg, "%d:%511s", &s->add, s->done_path) != 2) { free(s); return NULL; }
  return s;
}
void add_n_fini(void *ctx) {
  state *s = ctx;
  FILE *f = fopen(s->done_path, "w");
  if (f) { fputs("fini", f); fclose(f); }
  free(s);
}
int add_n(void *ctx, malcolm_task *t) {
  state *s = ctx;
  if (t->payload_len == 0) return MALCOLM_BAD_INPUT;
  for (uint32_t i = 0; i < t->payload_len && i < t->out_cap; i++)
    t->out[i] = (uint8_t)(t->payload[i] + s->add);
  t->out_len = t->payload_len;
  return MALCOLM_OK;
}
int plain(void *ctx, malcolm_task *t) { t->out_len = 0; return ctx == NULL ? 0 : 1; }
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("h")
    (d / "h.c").write_text(STATEFUL_C)
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "malcolm", "workers")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-I{inc}", str(d / "h.c"), "-o",
                    str(d / "libh.so")], check=True)
    return str(d / "libh.so")


@pytest.fixture(scope="module")
def cffi_mod(tmp_path_factory):
    """The same C as a cffi API-mode module; ``plain`` has no init/fini in its cdef."""
    cffi = pytest.importorskip("cffi")
    if shutil.which("gcc") is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("cffi")
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "malcolm", "workers")
    ffi = cffi.FFI()
    ffi.cdef("typedef struct malcolm_task malcolm_task;"
             "int add_n(void *, malcolm_task *); void *add_n_init(const char *);"
             "void add_n_fini(void *); int plain(void *, malcolm_task *);")
    ffi.set_source("_mc_state_handler", STATEFUL_C, include_dirs=[inc])
    ffi.compile(tmpdir=str(d), verbose=False)
    sys.path.insert(0, str(d))
    yield "_mc_state_handler"
    sys.path.remove(str(d))


@pytest.fixture(params=["so", "cffi"])
def where(request):
    """``so:PATH`` or ``cffi:MODULE``: the two kinds of compiled user handler."""
    if request.param == "so":
        return "so:" + request.getfixturevalue("lib")
    return "cffi:" + request.getfixturevalue("cffi_mod")


def test_init_gives_the_handler_its_state_and_fini_releases_it(where, tmp_path):
    done = tmp_path / "done"
    h = Handler(f"{where}:add_n@5:{done}")
    assert h.run(0, 0, b"\x01\x02") == (0, b"\x06\x07")
    assert h.run(0, 0, b"") == (2, b"")                 # MALCOLM_BAD_INPUT
    assert not done.exists()
    del h
    gc.collect()
    assert done.read_text() == "fini"


def test_each_handler_gets_its_own_state(where, tmp_path):
    """Two handlers from one library or module: two ctx, each released once."""
    a = Handler(f"{where}:add_n@1:{tmp_path / 'a'}")
    b = Handler(f"{where}:add_n@7:{tmp_path / 'b'}")
    assert a.run(0, 0, b"\x00") == (0, b"\x01") and b.run(0, 0, b"\x00") == (0, b"\x07")
    del a
    gc.collect()
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert b.run(0, 0, b"\x01") == (0, b"\x08")
    del b
    gc.collect()
    assert (tmp_path / "b").read_text() == "fini"


def test_plain_handlers_still_get_no_state(where):
    assert Handler(f"{where}:plain").run() == (0, b"")


def test_init_errors_are_clear(where):
    with pytest.raises(ValueError, match="add_n_init.*failed"):
        Handler(f"{where}:add_n@nonsense")
    with pytest.raises(ValueError, match="needs plain_init"):
        Handler(f"{where}:plain@x")
    with pytest.raises(ValueError, match="(so:PATH|cffi:MODULE):SYMBOL"):
        Handler(where)


def test_cffi_argument_may_hold_colons(cffi_mod, tmp_path):
    """The module name ends at the first ':'; everything after '@' is the argument."""
    done = tmp_path / "x:y"
    h = Handler(f"cffi:{cffi_mod}:add_n@2:{done}")
    assert h.run(0, 0, b"\x01") == (0, b"\x03")
    del h
    gc.collect()
    assert done.read_text() == "fini"


def test_bad_input_from_a_handler_reaches_the_client(where, tmp_path):
    """A handler's MALCOLM_BAD_INPUT is answered "bad input" and counted by the server."""
    from malcolm.net.transport import open_transport
    from malcolm.runtime.server import Server

    from malcolm.net import wire
    from malcolm.net.client import Client
    from malcolm.policy.registry import make_policy
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0, 1),
                 handler=f"{where}:add_n@1:{tmp_path / 'd'}", workers=1).start()
    try:
        with Client("udp", [tr.address]) as c:
            c.send(0, payload=b"\x01")
            c.send(0, task_type=1)
            acc = c.collect(5)
        st = srv.stats()
    finally:
        srv.stop()
    res = {v["task_type"]: v for v in acc.answered.values()}
    assert res[0]["status"] == wire.Status.OK and res[0]["payload"] == b"\x02"
    assert res[1]["status"] == wire.Status.BAD_INPUT
    assert st["bad_input"] == 1 and st["handler_errors"] == 0
