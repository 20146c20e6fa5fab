"""Build the native core.

Environment switches
--------------------
MALCOLM_NATIVE=1   add ``-march=native`` (the binary then runs only on this CPU family).
MALCOLM_DEBUG=1    debug build: ``-O0 -g``, C assertions on, Cython bounds checks on.
MALCOLM_SYMBOLS=1  keep the symbol table in the shared objects (for ``perf``); release builds
                   are otherwise built with ``-g0`` and stripped (a wheel a tenth the size).
MALCOLM_ONLY=glob  build only the extensions whose module name matches (for fast iteration).
MALCOLM_JOBS=N     parallel compile jobs (default: the number of CPUs).

Cython writes its generated C into ``build/cython/`` (not next to the ``.pyx``), where it is
reused by the next build while the ``.pyx``/``.pxd`` it came from are unchanged. When ``ccache``
is on PATH (and ``CC`` is not set), the C compiler runs through it, so that rebuilding an
unchanged tree (a fresh venv, or pip building the sdist again) is mostly cache hits.

An extension that needs a system library which is missing (libibverbs for the RDMA
transport, librocksdb for the ``rocksdb`` handler) is skipped with a message; the rest of the
package still installs.
"""

import fnmatch
import glob
import os
import shutil
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = os.environ.get("MALCOLM_NATIVE") == "1"
DEBUG = os.environ.get("MALCOLM_DEBUG") == "1"
ONLY = os.environ.get("MALCOLM_ONLY")
SYMBOLS = os.environ.get("MALCOLM_SYMBOLS") == "1"

# Extensions that link a system library: module -> (library, header, Debian package).
_IBVERBS = ("ibverbs", "infiniband/verbs.h", "libibverbs-dev")
SYSTEM_LIBS = {
    "malcolm.net._ud_queue": _IBVERBS,
    "malcolm.net._verbs": _IBVERBS,
    "malcolm.bench.verbs": _IBVERBS,
    "malcolm.workers.rocksdb": ("rocksdb", "rocksdb/c.h", "librocksdb-dev"),
}


def _have_header(header):
    return any(
        os.path.exists(os.path.join(d, header))
        for d in ("/usr/include", "/usr/local/include", "/usr/include/x86_64-linux-gnu")
    )


def _flags():
    """(compile flags, link flags, Cython directives) for this build."""
    if DEBUG:
        return ["-O0", "-g", "-UNDEBUG", "-DMALCOLM_DEBUG=1"], [], {
            "boundscheck": True, "wraparound": True, "initializedcheck": True}
    # Python's own CFLAGS carry -g: -g0 after them drops the DWARF (most of each .so, and a
    # good part of gcc's time on Cython's large C files); the linker then strips the symbol
    # table too unless MALCOLM_SYMBOLS=1 asks to keep it for profiling.
    # -falign-loops=32: the categorical's branch-free scan (_core.pxd, inlined into the
    # gateways) is a loop of 18 bytes, and where a build's layout put it across a 32-byte
    # fetch window it ran 1.4-1.6x slower (sample_ns.32 18.5 against 11.7 ns; docs/
    # performance.md, thirtieth session): an unrelated function added above it in a module
    # moved it there. Aligned, no layout decides it.
    cflags = ["-O3", "-g0", "-DNDEBUG", "-fno-math-errno", "-fno-trapping-math",
              "-falign-loops=32"]
    if NATIVE:
        cflags.append("-march=native")
    ldflags = [] if SYMBOLS else ["-Wl,--strip-all"]
    return cflags, ldflags, {"boundscheck": False, "wraparound": False,
                             "initializedcheck": False}


def _extensions():
    cflags, ldflags, directives = _flags()
    exts = []
    sources = sorted(glob.glob("malcolm/**/*.pyx", recursive=True))
    if not sources:
        # An sdist without its .pyx sources (or a build from the wrong directory) would
        # otherwise install a package whose every native import fails at run time.
        sys.exit("malcolm: no Cython sources (malcolm/**/*.pyx) found in "
                 f"{os.getcwd()}; refusing to build a package without its native core")
    for path in sources:
        mod = path[:-4].replace(os.sep, ".")
        if ONLY and not any(fnmatch.fnmatch(mod, p) for p in ONLY.split(",")):
            continue
        libs = []
        if mod in SYSTEM_LIBS:
            lib, header, pkg = SYSTEM_LIBS[mod]
            if not _have_header(header):
                print(f"malcolm: skipping {mod}: {header} not found "
                      f"(install the Debian package {pkg} to build it)", file=sys.stderr)
                continue
            libs.append(lib)
        exts.append(Extension(
            mod, [path], include_dirs=[np.get_include(), "malcolm"],
            libraries=libs + ["m"], extra_compile_args=cflags + ["-pthread"],
            extra_link_args=["-pthread"] + ldflags,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ))
    if not exts:
        sys.exit(f"malcolm: MALCOLM_ONLY={ONLY!r} matches no extension module")
    return cythonize(exts, language_level=3, compiler_directives=dict(
        directives, cdivision=True, embedsignature=True), annotate=False,
        nthreads=JOBS, quiet=True,
        # A debug build's C differs (bounds checks): its own directory, so that switching
        # MALCOLM_DEBUG never reuses C generated with the other directives.
        build_dir=os.path.join("build", "cython-debug" if DEBUG else "cython"))


def _use_ccache():
    """Compile through ccache when it is installed and the user did not choose a compiler."""
    ccache = shutil.which("ccache")
    if ccache and "CC" not in os.environ:
        import sysconfig
        cc = sysconfig.get_config_var("CC") or "cc"
        os.environ["CC"] = f"{ccache} {cc}"
        # distutils links shared objects with LDSHARED, which starts with the compiler too
        ldshared = sysconfig.get_config_var("LDSHARED")
        if ldshared and "LDSHARED" not in os.environ:
            os.environ["LDSHARED"] = f"{ccache} {ldshared}"


class ParallelBuildExt(build_ext):
    """Compile the extensions in parallel (cythonize is parallel too): a fresh build of the
    whole package is several minutes of gcc on one core."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = JOBS


JOBS = int(os.environ.get("MALCOLM_JOBS", "0")) or os.cpu_count() or 1

def _sdist_only():
    """True when setup.py only describes or packs the sources (sdist, egg_info, dist_info):
    then the extensions are listed by their .pyx, not cythonized, so that packing is fast and
    the sdist ships the Cython sources rather than generated C."""
    # PEP 517 front ends pass option values as separate words (sdist --formats gztar), so
    # look at the first command and make sure no building command follows.
    words = [a for a in sys.argv[1:] if not a.startswith("-")]
    building = {"build", "build_ext", "build_py", "bdist", "bdist_wheel", "editable_wheel",
                "develop", "install"}
    return bool(words) and words[0] in {"sdist", "egg_info", "dist_info"} \
        and not building & set(words)


if _sdist_only():
    _ext_modules = [Extension(p[:-4].replace(os.sep, "."), [p])
                    for p in sorted(glob.glob("malcolm/**/*.pyx", recursive=True))]
else:
    _use_ccache()
    _ext_modules = _extensions()
setup(ext_modules=_ext_modules, cmdclass={"build_ext": ParallelBuildExt})
