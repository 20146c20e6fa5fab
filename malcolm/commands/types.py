"""The CLI's shared grammar: parameter types and options every subcommand spells the same way.

* :class:`Duration`: ``5s``, ``500ms``, ``50us`` (or ``µs``), ``2m``; a bare number is in the
  option's own unit, which its help names.
* :class:`Rate`: ``20000``, ``20k``, ``1.5M``, optionally ending in ``/s``; per second.
* :class:`IntRange`, :class:`FloatRange`, :data:`FLOAT`: click's, reading ASCII digits only,
  as every other number of the CLI (:func:`malcolm._units.ascii_number`).
* :func:`json_option`: ``--json [FILE|-]``; ``--json`` alone or ``--json -`` is stdout.
* :class:`JsonArgsCommand`: a command with positional arguments and ``--json``, where
  ``--json`` takes the next word as FILE only when it looks like one (see there).
* :func:`write_json`: writes what a ``--json`` or ``--csv`` asked for, one line on failure.

Bad input gives click's one-line usage error (``Invalid value for '--duration': ...``), never
a traceback.
"""

from __future__ import annotations

import json
import math
import os
import stat

import click

from malcolm._files import shown
from malcolm._units import (
    _DURATION_UNITS,
    ascii_number,
    parse_duration,
    parse_rate,
    split_items,
)


class Duration(click.ParamType):
    """A duration option; the value is a float in ``unit`` (``"s"``, ``"ms"``, ``"us"``).

    Parameters
    ----------
    unit : str
        The unit of a bare number and of the value handed to the command.
    min, max : float, optional
        Bounds in ``unit``, inclusive (``min_open``: exclusive lower bound).
    """

    name = "duration"

    def __init__(self, unit: str = "s", min: float | None = None, max: float | None = None,
                 min_open: bool = False):
        if unit not in _DURATION_UNITS:
            raise ValueError(f"unknown unit {unit!r}")
        self.unit, self.min, self.max, self.min_open = unit, min, max, min_open

    def get_metavar(self, param, ctx=None):
        return "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            v = parse_duration(value, self.unit)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        u = "us" if self.unit == "µs" else self.unit
        if self.min is not None and (v < self.min or (self.min_open and v == self.min)):
            self.fail(f"{value!r} must be {'>' if self.min_open else '>='} {self.min:g}{u}",
                      param, ctx)
        if self.max is not None and v > self.max:
            self.fail(f"{value!r} must be <= {self.max:g}{u}", param, ctx)
        return v


class Rate(click.ParamType):
    """A rate per second (``20k``, ``1.5M``); with ``many``, a comma-separated list of them
    (the value is then a list)."""

    name = "rate"

    def __init__(self, many: bool = False):
        self.many = many

    def get_metavar(self, param, ctx=None):
        return "RATE[,RATE...]" if self.many else "RATE"

    def convert(self, value, param, ctx):
        if isinstance(value, (float, list)):
            return value
        try:
            if not self.many:
                return parse_rate(value)
            return [parse_rate(p) for p in split_items(value)]
        except ValueError as e:
            self.fail(str(e), param, ctx)


class _AsciiNumber:
    """A mixin for click's number types: a string is read by
    :func:`malcolm._units.ascii_number` first (click's int() read ``--tasks ２０００``, while
    ``--delay ２`` was refused)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            try:
                ascii_number(value, self._number_class)
            except ValueError:
                what = "integer" if self._number_class is int else "number"
                self.fail(f"{value!r} is not a valid {what} (ASCII digits only)", param, ctx)
        return super().convert(value, param, ctx)


class IntRange(_AsciiNumber, click.IntRange):
    """:class:`click.IntRange` of ASCII digits."""


class FloatRange(_AsciiNumber, click.FloatRange):
    """:class:`click.FloatRange` of ASCII digits."""


class _Float(_AsciiNumber, click.types.FloatParamType):
    pass


class _Int(_AsciiNumber, click.types.IntParamType):
    pass


#: ``type=float`` and ``type=int`` of ASCII digits.
FLOAT, INT = _Float(), _Int()


def json_option(what: str = "the result"):
    """``--json [FILE|-]``: write ``what`` as JSON to FILE; ``--json`` alone or ``--json -``
    prints it to stdout instead of the text output. The command gets ``json_out`` (None, or
    the path, ``"-"`` for stdout)."""
    return click.option("--json", "json_out", is_flag=False, flag_value="-", default=None,
                        metavar="[FILE|-]",
                        help=f"Write {what} as JSON to FILE; '-' or no value: to stdout "
                             "(replacing the text output).")


class JsonArgsCommand(click.Command):
    """A command that takes positional arguments and ``--json [FILE|-]``.

    ``--json WORD`` would otherwise swallow a positional argument as its FILE (``malcolm
    list policies --json jbt`` writing the whole list to a file named ``jbt``). Here
    ``--json`` takes the next word as FILE only when it is ``-``, names a path (holds a
    ``/``) or ends in ``.json``; any other word is an argument and ``--json`` means stdout.
    ``--json=FILE`` always names FILE.
    """

    def parse_args(self, ctx, args):
        out, i = [], 0
        while i < len(args):
            a = args[i]
            out.append(a)
            if a == "--":
                out += args[i + 1:]
                break
            if a == "--json" and i + 1 < len(args):
                nxt = args[i + 1]
                if not (nxt.startswith("-") or "/" in nxt or nxt.endswith(".json")):
                    out.append("-")
            i += 1
        return super().parse_args(ctx, out)


def jsonable(v):
    """A JSON-safe copy: NaN and infinities become null, numpy scalars plain numbers, keys
    starting with ``_`` (private to the run, like raw samples) are dropped."""
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items() if not str(k).startswith("_")}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if getattr(v, "ndim", 0) and hasattr(v, "tolist"):        # a numpy array
        return jsonable(v.tolist())
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_json(dest: str, obj, indent: int | None = None) -> None:
    """Write ``obj`` as JSON to ``dest`` (``"-"``: stdout). A file is replaced atomically;
    an unwritable one is a one-line :class:`click.ClickException`."""
    text = json.dumps(jsonable(obj), indent=indent, allow_nan=False, default=str)
    if dest == "-":
        click.echo(text)
        return
    write_text(dest, text + "\n", "--json")


def write_text(dest: str, text: str, what: str) -> None:
    """Write ``text`` to file ``dest`` via a temporary file; a failure is one line and leaves
    no temporary file behind (``dest`` a directory failed only at the rename)."""
    from malcolm._files import write_file
    try:
        write_file(dest, text)      # in place where dest is a FIFO or a device
    except OSError as e:
        raise click.ClickException(f"{what} {shown(dest)}: {e.strerror}") from None


def refuse_empty(**flags) -> None:
    """One line for a flag given as an empty string (``--key-file "$UNSET"``), which the
    command would otherwise take for the flag not given at all. Keys: the flags' names
    with ``_`` for ``-``."""
    for name, value in flags.items():
        if isinstance(value, str) and not value.strip():
            raise click.BadParameter("is empty", param_hint="--" + name.replace("_", "-"))


def check_writable(path, flag: str) -> None:
    """Fail now, in one line, when output file ``path`` (``"-"``: stdout; None: not asked
    for) could not be written after a long run: a directory, a folder that is missing or
    not writable, or a file that cannot be made or opened there. Leaves nothing behind: a
    new file is made and removed at once, an existing one opened without truncation, and a
    FIFO or a device left alone (opening a FIFO for writing waits for a reader)."""
    if path is None or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path)) if str(path).strip() else ""
    if not folder:
        why = "is empty"
    elif os.path.isdir(path):
        why = f"{shown(path)} is a directory"
    elif not os.path.isdir(folder):
        why = f"{shown(path)}: no directory {shown(folder)}"
    elif not os.access(folder, os.W_OK):
        why = f"{shown(path)}: {shown(folder)} is not writable"
    else:
        why = _cannot_write(path)
        if why is None:
            return
    raise click.BadParameter(why, param_hint=flag)


def _cannot_write(path) -> str | None:
    """Why ``path`` cannot be written, found by making it (then removing it) or opening it
    for appending; None if it can. As root, os.access says yes to folders such as /proc and
    /sys, where no file can be made: the run then failed only at its end."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):    # dangling: the write replaces the link (write_file)
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as e:
            return f"{shown(path)}: cannot be made: {e.strerror}"
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    except OSError as e:
        return f"{shown(path)}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as e:
        return f"{shown(path)}: cannot be written: {e.strerror}"
    return None


def check_plot_format(path, flag: str = "--plot") -> None:
    """Refuse now, not after the runs, a plot file whose extension matplotlib cannot write (no
    extension: PNG, matplotlib's default). Without matplotlib the plot is skipped anyway."""
    if path is None:
        return
    if path == "-":         # a PNG is not for a terminal or a pipe; it made a file named "-"
        raise click.BadParameter("'-' (stdout) is not supported: give a file", param_hint=flag)
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not ext:
        return
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return
    kinds = FigureCanvasBase.get_supported_filetypes()
    if ext not in kinds:
        raise click.BadParameter(f"{path}: a .{ext} file is not a plot format matplotlib "
                                 f"writes ({', '.join(sorted(kinds))})", param_hint=flag)
