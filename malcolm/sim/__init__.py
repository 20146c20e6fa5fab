"""Discrete-event rack simulator.

:func:`simulate` runs one configuration; :func:`parse_rack` reads rack specs. The native
engine (``malcolm.sim._engine``) is imported only when a simulation runs, so the pure-Python
parts stay importable without a build.
"""

from malcolm.sim.rack import Rack, parse_rack


def simulate(*args, **kwargs):
    """See :func:`malcolm.sim.run.simulate`."""
    from malcolm.sim.run import simulate as _simulate

    return _simulate(*args, **kwargs)


def __getattr__(name):
    if name in ("SimResult", "Change"):
        from malcolm.sim import run

        return getattr(run, name)
    raise AttributeError(name)


__all__ = ["Change", "Rack", "SimResult", "parse_rack", "simulate"]
