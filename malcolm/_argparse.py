"""The CLI's grammar for the ``argparse`` scripts below it (``bench/``): the same spellings as
``malcolm`` itself (docs/cli.md), so that a flag means one thing everywhere.

* :func:`duration`: ``5s``, ``500ms``, ``50us``; a bare number is in the option's unit.
* :func:`rate`: ``20000``, ``20k``, ``1.5M``, ``20k/s``.
* :func:`loads`: ``0.5,0.7`` or ``0.5:0.95:0.05`` (START:STOP:STEP, STOP included).
* :func:`servers`: a servers spec (``2x14,9x4``) or a named preset (``homo``, ``hetero``).
* :func:`add_json`: ``--json [FILE|-]``; :func:`write_json` adds the run metadata.
* :func:`add_window_phase`: the simulator's ``--window`` and ``--phase``.
* :func:`parser`: an ``ArgumentParser`` whose ``--help`` ends with ``Examples:``.

A bad value is argparse's one-line usage error naming the option (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from malcolm._units import ascii_number, parse_duration, parse_rate, rack_groups, split_items

__all__ = ["PRESETS", "SIM_PHASES", "SIM_WINDOW_US", "add_json", "add_window_phase",
           "duration", "hidden_alias", "json_stdout", "loads", "parser", "rate", "seeds",
           "servers", "write_json"]

# The racks of the thesis's evaluation (Ch. 7), by name.
PRESETS = {"homo": "8x8", "hetero": "2x14,9x4"}
# The simulator's window phases (malcolm.sim.simulate's ``phase``) and its default window,
# which is the runtime's too
SIM_PHASES = ("random", "staggered", "aligned")
SIM_WINDOW_US = 100.0
# The most loads and seeds one option takes: a sweep of more runs for days
MAX_LOADS, MAX_SEEDS = 10_000, 100_000
# [0-9], not \d, which reads other scripts' digits ('８x８'), as malcolm.sim.rack's
_SPEC = re.compile(r"[0-9]+x[0-9]+(@[0-9.]+)?(,[0-9]+x[0-9]+(@[0-9.]+)?)*")


def parser(doc: str, examples: str, **kw) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose help ends with examples.

    Parameters
    ----------
    doc : str
        The script's docstring; its first paragraph (without RST markup) describes it.
    examples : str
        Command lines, one a line, shown under ``Examples:``.
    **kw
        Passed to :class:`argparse.ArgumentParser`.
    """
    lines = "\n".join("  " + ln.strip() for ln in examples.strip().splitlines())
    desc = doc.strip().split("\n\n")[0].replace("``", "")      # no RST markup in --help
    ap = argparse.ArgumentParser(description=desc, epilog=f"Examples:\n{lines}\n",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, **kw)
    # ``type=int`` and ``type=float`` read ASCII digits only, as every ``malcolm`` option does
    # (``int()`` reads ``８`` as 8 and ``1_0`` as 10): argparse looks a type up in this
    # registry before calling it, and argument groups share it
    ap.register("type", int, _ascii_int)
    ap.register("type", float, _ascii_float)
    return ap


def _ascii_int(text):
    return ascii_number(text, int)


def _ascii_float(text):
    return ascii_number(text, float)


# argparse names the type in its message: "invalid int value: '８'"
_ascii_int.__name__ = "int"
_ascii_float.__name__ = "float"


def duration(unit: str = "s", positive: bool = False):
    """An argparse ``type``: a duration, as a float in ``unit``.

    Parameters
    ----------
    unit : str
        ``"ns"``, ``"us"``, ``"ms"``, ``"s"``...: the unit of a bare number and of the value.
    positive : bool
        Refuse 0.
    """
    def convert(text):
        try:
            v = parse_duration(text, unit)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if positive and v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return v
    convert.__name__ = "duration"
    return convert


def rate(text) -> float:
    """An argparse ``type``: a rate per second."""
    try:
        return parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def numbers(cast=float, what="numbers"):
    """An argparse ``type`` factory: a comma-separated list of ``cast`` values (``2,10``)."""
    def parse(text):
        try:
            out = [ascii_number(v, cast) for v in str(text).split(",")]
            # float() reads nan and inf: a --delays or --load-range of NaN ran as garbage
            if not all(math.isfinite(v) for v in out):
                raise ValueError
            return out
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {what} separated by commas, got {text!r}") from None
    parse.__name__ = what            # argparse names the type in its own messages
    return parse


def seeds(text) -> list[int]:
    """An argparse ``type``: distinct simulation seeds >= 0, ``1,2,5`` or ``1-20`` (both ends
    included) or a mix of the two (``numbers(int)`` reads the lists alone)."""
    out = []
    try:
        for part in str(text).split(","):
            lo, _, hi = part.strip().partition("-")
            first = ascii_number(lo, int)
            last = ascii_number(hi, int) if hi else first
            # a range of 10**12 seeds built the list for minutes (10**50: OverflowError), and
            # the simulator takes seeds below 2**64 only
            if (first < 0 or last < first or last >= 2**64
                    or len(out) + last - first >= MAX_SEEDS):
                raise ValueError
            out += range(first, last + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_SEEDS} seeds in 0..2^64-1 as 1,2,5 or 1-20, got {text!r}"
        ) from None
    if len(set(out)) < len(out):
        raise argparse.ArgumentTypeError(f"must be distinct seeds, got {text!r}")
    return out


def loads(text) -> list[float]:
    """An argparse ``type``: loads ``0.5,0.7`` or ``0.5:0.95:0.05`` (STOP included)."""
    try:
        parts = split_items(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    out = []
    for part in parts:
        try:
            if part.count(":") == 2:
                a, b, s = (ascii_number(x) for x in part.split(":"))
                steps = (b - a) / s if s > 0 else math.nan
                # 1:1e308:1 built the list forever (-inf:-1:1 was an OverflowError)
                if b < a or not math.isfinite(steps) or len(out) + steps >= MAX_LOADS:
                    raise ValueError
                k = int(math.floor(steps + 1e-9))
                out += [round(a + i * s, 10) for i in range(k + 1)]
            else:
                out.append(ascii_number(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a load (examples: 0.5,0.7 or 0.5:0.95:0.05; at most "
                f"{MAX_LOADS} loads)") from None
    if not out or not all(math.isfinite(x) and x > 0 for x in out):
        raise argparse.ArgumentTypeError(f"{text!r}: loads must be > 0")
    return out


def servers(text) -> str:
    """An argparse ``type``: a servers spec (``2x14,9x4``, ``2x14@2.0,9x4``) or a preset name
    (:data:`PRESETS`), returned as a spec."""
    t = str(text).strip()
    if t in PRESETS:
        return PRESETS[t]
    if not _SPEC.fullmatch(t):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a servers spec (COUNTxWORKERS[@SPEED],...: 8x8, 2x14,9x4) "
            f"nor a preset ({', '.join(f'{k}={v}' for k, v in PRESETS.items())})")
    # the grammar alone passed 0x8, 8x0, 8x8@1..2 and 100x1, which the simulator then
    # refused with a traceback: its groups are read as the simulator reads them, limits and all
    try:
        rack_groups(t)
    except ValueError as e:         # also a count of over 4300 digits
        raise argparse.ArgumentTypeError(str(e)) from None
    return t


def checked(ap: argparse.ArgumentParser, option: str, check, value):
    """``check(value)``, with its ``ValueError`` turned into ``ap.error`` (one line, exit 2)
    naming ``option``: for a check from a layer above this module, which it must not import
    (the scripts' ``--policies`` go through ``malcolm.sim.check_policies``)."""
    try:
        return check(value)
    except ValueError as e:
        ap.error(f"{option} {e}")


def hidden_alias(ap: argparse.ArgumentParser, old: str, dest: str, **kw) -> None:
    """The first release's spelling ``old`` of the option stored in ``dest``, kept working
    but left out of ``--help``."""
    ap.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kw)


def add_window_phase(ap: argparse.ArgumentParser) -> None:
    """``--window DURATION`` (µs, default :data:`SIM_WINDOW_US`) and ``--phase`` (one of
    :data:`SIM_PHASES`, default random): every simulated server's policy window and phase."""
    ap.add_argument("--window", type=duration("us", positive=True), default=SIM_WINDOW_US,
                    metavar="DURATION", help="every server's policy window (bare number: µs; "
                    "default 100us, the runtime's)")
    ap.add_argument("--phase", choices=SIM_PHASES, default="random",
                    help="the servers' window phases (default random; aligned: every window "
                         "ends at the same instant)")


def add_json(ap: argparse.ArgumentParser, what: str = "the results") -> None:
    """``--json [FILE|-]``: ``what`` and the run metadata as JSON to FILE; ``-`` or no value
    to stdout (the text output then goes to stderr)."""
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE|-",
                    help=f"write {what} and the run metadata as JSON to FILE; '-' or no "
                         "value: to stdout (the text then goes to stderr)")


_real_stdout = []


def json_stdout(a: argparse.Namespace) -> None:
    """Call after parsing: with ``--json -`` the script's own prints go to stderr, so that
    stdout holds only the JSON."""
    if getattr(a, "json", None) == "-" and not _real_stdout:
        _real_stdout.append(sys.stdout)
        sys.stdout = sys.stderr


def write_json(a: argparse.Namespace, obj: dict, dest: str | None = None) -> None:
    """Write ``obj`` with a ``metadata`` object as JSON.

    Parameters
    ----------
    a : argparse.Namespace
        The parsed arguments: the metadata's ``config`` (every parameter), and ``a.json``.
    obj : dict
        The results; NaN and infinities are written as ``null``.
    dest : str, optional
        A file to write; default ``a.json`` (``"-"``: stdout; nothing when unset).
    """
    dest = dest or getattr(a, "json", None)
    if not dest:
        return
    from malcolm._metadata import run_metadata
    obj = dict(obj, metadata=run_metadata(vars(a)))
    text = json.dumps(_clean(obj), indent=1, allow_nan=False, default=str)
    if dest == "-":
        print(text, file=_real_stdout[0] if _real_stdout else sys.stdout, flush=True)
        return
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    from malcolm._files import write_file
    write_file(dest, text + "\n")


def _clean(v):
    """A JSON-safe copy: numpy values become plain ones, NaN and infinities ``null``."""
    if hasattr(v, "tolist"):                # numpy scalars and arrays
        v = v.tolist()
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
