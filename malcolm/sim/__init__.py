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


def check_policies(text):
    """Check a list of policy specs by running each once on a tiny rack.

    A script calls it before it starts worker processes, so that a bad spec is one line
    there, not a traceback from one of them.

    Parameters
    ----------
    text : str
        Policy specs as in ``malcolm sim --policy``, separated by ';'.

    Returns
    -------
    list of str
        The specs, stripped, empty ones dropped.

    Raises
    ------
    ValueError
        The first spec that does not build, named, with the policy's own message.
    """
    pols = [p.strip() for p in text.split(";") if p.strip()]
    for p in pols:
        try:
            simulate(rack="1x1,1x1", policy=p, tasks=10, seed=1)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{p!r}: {e}") from None
    return pols


def __getattr__(name):
    if name in ("SimResult", "RackChange"):
        from malcolm.sim import run

        return getattr(run, name)
    raise AttributeError(name)


__all__ = ["RackChange", "Rack", "SimResult", "check_policies", "parse_rack_spec", "simulate"]
