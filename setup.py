"""Build the native core.

Environment switches
--------------------
MALCOLM_NATIVE=1   add ``-march=native`` (the binary then runs only on this CPU family).
MALCOLM_DEBUG=1    debug build: ``-O0 -g``, C assertions on, Cython bounds checks on.
MALCOLM_ONLY=glob  build only the extensions whose module name matches (for fast iteration).
MALCOLM_JOBS=N     parallel compile jobs (default: the number of CPUs).

An extension that needs a system library which is missing (libibverbs for the RDMA
transport, librocksdb for the ``rocksdb`` handler) is skipped with a message; the rest of the
package still installs.
"""

import fnmatch
import glob
import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = os.environ.get("MALCOLM_NATIVE") == "1"
DEBUG = os.environ.get("MALCOLM_DEBUG") == "1"
ONLY = os.environ.get("MALCOLM_ONLY")

# Extensions that link a system library: module -> (library, header, Debian package).
SYSTEM_LIBS = {
    "malcolm.net._verbs": ("ibverbs", "infiniband/verbs.h", "libibverbs-dev"),
    "malcolm.workers.rocksdb": ("rocksdb", "rocksdb/c.h", "librocksdb-dev"),
}


def _have_header(header):
    return any(
        os.path.exists(os.path.join(d, header))
        for d in ("/usr/include", "/usr/local/include", "/usr/include/x86_64-linux-gnu")
    )


def _flags():
    if DEBUG:
        return ["-O0", "-g", "-UNDEBUG", "-DMALCOLM_DEBUG=1"], {
            "boundscheck": True, "wraparound": True, "initializedcheck": True}
    cflags = ["-O3", "-DNDEBUG", "-fno-math-errno", "-fno-trapping-math"]
    if NATIVE:
        cflags.append("-march=native")
    return cflags, {"boundscheck": False, "wraparound": False, "initializedcheck": False}


def _extensions():
    cflags, directives = _flags()
    exts = []
    for path in sorted(glob.glob("malcolm/**/*.pyx", recursive=True)):
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
            extra_link_args=["-pthread"],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ))
    return cythonize(exts, language_level=3, compiler_directives=dict(
        directives, cdivision=True, embedsignature=True), annotate=False,
        nthreads=JOBS, quiet=True)


class ParallelBuildExt(build_ext):
    """Compile the extensions in parallel (cythonize is parallel too): a fresh build of the
    whole package is several minutes of gcc on one core."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = JOBS


JOBS = int(os.environ.get("MALCOLM_JOBS", "0")) or os.cpu_count() or 1

setup(ext_modules=_extensions(), cmdclass={"build_ext": ParallelBuildExt})
