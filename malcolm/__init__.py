"""malcolm: a multi-agent learning load balancer for microsecond-scale services at rack scale."""

import os

__version__ = "0.1.0"


def get_include():
    """Directory of malcolm's C headers, for extensions that ``cimport malcolm._core``.

    The ``.pxd`` files are found by Cython through the installed package itself; the C
    compiler also needs the headers they name (``_native.h``, ``workers/malcolm_handler.h``),
    which live in this directory. Like :func:`numpy.get_include`::

        Extension("mine", ["mine.pyx"],
                  include_dirs=[malcolm.get_include(), numpy.get_include()])

    Returns
    -------
    str
        Absolute path of the installed ``malcolm`` package directory.
    """
    return os.path.dirname(os.path.abspath(__file__))
