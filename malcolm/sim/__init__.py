"""Discrete-event rack simulator.

:func:`simulate` runs one configuration; :func:`parse_rack_spec` reads rack specs. The native
engine (``malcolm.sim._engine``) is imported only when a simulation runs, so the pure-Python
parts stay importable without a build.
"""

from malcolm.sim.rack import Rack, parse_rack_spec


def simulate(*args, **kwargs):
    """See :func:`malcolm.sim.run.simulate`."""
    from malcolm.sim.run import simulate as _simulate

    return _simulate(*args, **kwargs)


def __getattr__(name):
    if name in ("SimResult", "RackChange"):
        from malcolm.sim import run

        return getattr(run, name)
    raise AttributeError(name)


__all__ = ["RackChange", "Rack", "SimResult", "parse_rack_spec", "simulate"]
