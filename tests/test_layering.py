"""The package's layering, checked from the source: no module imports (or cimports) from a
layer above its own, and the simulator and the server runtime never import each other.

Layers, lowest first (docs/design.md):

    core     _core, _native, _estimator, _lockfree, _workload, workloads, _units, _argparse,
             _metadata, the package root, self-tests
    policy   malcolm.policy: the interface, the policies, the window driver
    engines  malcolm.sim | malcolm.net, malcolm.workers (siblings: sim never sees net)
    runtime  malcolm.runtime: the server, its gateway and policy thread, rack files, launcher
    tools    malcolm.loadgen, malcolm.bench
    cli      malcolm.commands, malcolm.cli, malcolm._entry, malcolm.__main__
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "malcolm")

LAYERS = [
    ("core", ("malcolm", "malcolm._core", "malcolm._native", "malcolm._workload",
              "malcolm._estimator", "malcolm._lockfree", "malcolm._metadata", "malcolm._units",
              "malcolm._argparse", "malcolm.workloads", "malcolm._selftest",
              "malcolm._version")),
    ("policy", ("malcolm.policy",)),
    ("engines", ("malcolm.sim", "malcolm.net", "malcolm.workers")),
    ("runtime", ("malcolm.runtime",)),
    ("tools", ("malcolm.loadgen", "malcolm.bench")),
    ("cli", ("malcolm.commands", "malcolm.cli", "malcolm._entry", "malcolm.__main__")),
]
# Within "engines": the simulator is one clock, the server runtime the other.
SIBLINGS_APART = [("malcolm.sim",), ("malcolm.net", "malcolm.workers")]

_IMPORT = re.compile(
    r"^\s*(?:from\s+(malcolm(?:\.[\w.]+)?)\s+c?import\s+([\w\s,*()]+)"
    r"|c?import\s+(malcolm(?:\.[\w.]+)?))", re.M)


def _prefix_of(mod, prefixes):
    best = None
    for p in prefixes:
        if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > len(best)):
            best = p
    return best


def layer_of(mod):
    """Index of the layer that owns ``mod`` (longest matching prefix), or None."""
    best, idx = None, None
    for i, (_, prefixes) in enumerate(LAYERS):
        p = _prefix_of(mod, prefixes)
        if p is not None and (best is None or len(p) > len(best)):
            best, idx = p, i
    return idx


def _group(mod):
    for i, g in enumerate(SIBLINGS_APART):
        if _prefix_of(mod, g):
            return i
    return None


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(os.path.splitext(path)[1])]
    parts = rel.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(text):
    """Modules named by import/cimport statements (``from malcolm import x`` gives
    ``malcolm.x`` where x is a submodule name, else ``malcolm``)."""
    out = set()
    for m in _IMPORT.finditer(text):
        if m.group(3):
            out.add(m.group(3))
            continue
        base, names = m.group(1), m.group(2)
        if base == "malcolm":
            for nm in re.split(r"[\s,()]+", names):
                if not nm or nm == "*":
                    continue
                if os.path.isdir(os.path.join(PKG, nm)) or any(
                        os.path.exists(os.path.join(PKG, nm + ext))
                        for ext in (".py", ".pyx", ".pxd")):
                    out.add(f"malcolm.{nm}")
            out.add("malcolm")
        else:
            out.add(base)
    return out


def violations(files):
    """(importer, imported, why) for every import that breaks the layering."""
    bad = []
    for path in files:
        src = module_name(path)
        ls = layer_of(src)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for dst in sorted(imports_of(text)):
            ld = layer_of(dst)
            if ls is None:
                bad.append((src, dst, "module in no layer: add it to LAYERS"))
            elif ld is None:
                bad.append((src, dst, "imported module in no layer: add it to LAYERS"))
            elif ld > ls:
                bad.append((src, dst, f"upward: {LAYERS[ls][0]} imports {LAYERS[ld][0]}"))
            elif ld == ls and _group(src) is not None and _group(dst) is not None \
                    and _group(src) != _group(dst):
                bad.append((src, dst, "the simulator and the server runtime import each other"))
    return bad


def _sources():
    for dirpath, dirnames, filenames in os.walk(PKG):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            if fn.endswith((".py", ".pyx", ".pxd")):
                yield os.path.join(dirpath, fn)


def test_no_upward_imports():
    bad = violations(sorted(_sources()))
    assert not bad, "\n".join(f"{a} -> {b}: {why}" for a, b, why in bad)


def test_the_check_catches_an_upward_import(tmp_path):
    # The checker must be able to fail: a policy module that imports the CLI, a simulator
    # module that cimports the worker pool (a sibling), and a net module that imports the
    # runtime above it.
    d = tmp_path / "malcolm" / "policy"
    d.mkdir(parents=True)
    (d / "bad.py").write_text("from malcolm.commands import demo\n")
    s = tmp_path / "malcolm" / "sim"
    s.mkdir(parents=True)
    (s / "bad.pyx").write_text("from malcolm.workers.pool cimport WorkerPool\n")
    t = tmp_path / "malcolm" / "net"
    t.mkdir(parents=True)
    (t / "bad.py").write_text("from malcolm.runtime import server\n")
    global ROOT
    old = ROOT
    ROOT = str(tmp_path)
    try:
        bad = violations([str(d / "bad.py"), str(s / "bad.pyx"), str(t / "bad.py")])
    finally:
        ROOT = old
    assert [(a, b) for a, b, _ in bad] == [("malcolm.policy.bad", "malcolm.commands"),
                                           ("malcolm.sim.bad", "malcolm.workers.pool"),
                                           ("malcolm.net.bad", "malcolm.runtime")]


MAX_LINES = 800
_SOURCE_EXT = (".py", ".pyx", ".pxd", ".h", ".c")


def _oversized(root):
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(_SOURCE_EXT):
                p = os.path.join(dirpath, f)
                if f.endswith(".c") and os.path.exists(p[:-2] + ".pyx"):
                    continue        # Cython's generated C beside its source (old builds)
                with open(p, encoding="utf-8", errors="replace") as fh:
                    n = sum(1 for _ in fh)
                if n > MAX_LINES:
                    out.append(f"{os.path.relpath(p, ROOT)}: {n} lines")
    return out


def test_no_source_file_over_800_lines():
    """Issue 16: small modules with one job each; a file that grows past 800 lines is split."""
    assert _oversized(PKG) == []


def test_the_size_check_can_fail(tmp_path):
    (tmp_path / "big.pyx").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "small.py").write_text("x = 1\n" * MAX_LINES)
    assert [s.split(":")[0].endswith("big.pyx") for s in _oversized(str(tmp_path))] == [True]
