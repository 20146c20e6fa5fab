"""Load a ``bench/`` script as a module, by its path: the scripts are not a package, and a
test reads their functions (a draw, a rule) without running their ``main``."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(relpath):
    """The module at ``ROOT/relpath`` (``bench/settle_sweep.py``), named after its file."""
    path = os.path.join(ROOT, relpath)
    spec = importlib.util.spec_from_file_location(
        os.path.splitext(os.path.basename(path))[0], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
