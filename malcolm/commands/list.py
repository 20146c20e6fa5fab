"""``malcolm list``: what ``--policy``, ``--workload`` and a rack file's ``handler`` accept.

Everything shown is read from where the code itself takes it, so the listing cannot drift
from what the parsers accept: policies and their parameters from
:data:`malcolm.policy.registry.POLICIES` (Malcolm's own from ``MalcolmPolicy``'s ``DEFAULTS``
and the *Parameters* section of its docstring), workloads from
:data:`malcolm.workloads.NAMED` and the module's mixture syntax, handlers from the spec table
in the docstring of :mod:`malcolm.workers.handlers`.
"""

from __future__ import annotations

import re
import shutil
import textwrap

import click

from malcolm.commands.types import JsonArgsCommand, json_option, write_json

EXAMPLES_POLICIES = """
\b
Examples:
  malcolm list policies               every policy, its kind and parameters
  malcolm list policies malcolm       one policy in full
  malcolm list policies --json        the same as JSON, for scripts
  malcolm sim --policy jbt:threshold=4   then use one, with a parameter
"""


@click.group("list", epilog="""
\b
Examples:
  malcolm list policies
  malcolm list policies jbt
  malcolm list workloads
  malcolm list handlers
""")
def list_():
    """List the policies, workloads and task handlers, with their parameters and help."""


# ------------------------------------------------------------------------------ policies

def _numpydoc_params(doc: str) -> dict[str, tuple[str, str]]:
    """``{name: (type, help)}`` from a numpydoc *Parameters* section.

    ``a, b : float`` documents both names with one text.
    """
    out: dict[str, tuple[str, str]] = {}
    lines = textwrap.dedent("\n".join((doc or "").splitlines()[1:])).splitlines()
    try:
        start = next(i for i, ln in enumerate(lines)
                     if ln.strip() == "Parameters" and i + 1 < len(lines)
                     and set(lines[i + 1].strip()) == {"-"})
    except StopIteration:
        return out
    body = lines[start + 2:]
    # The section ends where the next one's title (a line over an underline of dashes) starts.
    for i in range(len(body) - 1):
        if body[i].strip() and set(body[i + 1].strip()) == {"-"}:
            body = body[:i]
            break
    names: list[str] = []
    typ, text = "", []
    for ln in body + ["END : "]:
        if ln and not ln[0].isspace():          # "name : type" or "a, b : type"
            for n in names:
                out[n] = (typ, " ".join(text))
            head, _, typ = ln.partition(" : ")
            names = [n.strip() for n in head.split(",") if n.strip()]
            typ, text = typ.strip(), []
        elif ln.strip():
            text.append(ln.strip())
    return out


def policy_params(name: str) -> list[dict]:
    """Parameters of policy ``name``: dicts with ``name``, ``type``, ``default``, ``help``.

    Raises
    ------
    ValueError
        Unknown policy, or Malcolm's module is not built (its parameters live there).
    """
    from malcolm.policy import registry
    info = registry._info(name)
    if info.params is not None:
        return [{"name": k, "type": t.__name__, "default": d, "help": h}
                for k, (t, d, h) in info.params.items()]
    try:
        mod = __import__(info.module, fromlist=[info.cls])
    except ImportError as e:
        raise ValueError(f"policy {info.name}: cannot import {info.module} to read its "
                         f"parameters ({e}); is the extension built?") from None
    cls = getattr(mod, info.cls)
    docs = _numpydoc_params(cls.__doc__)
    defaults = getattr(mod, "DEFAULTS", {})
    return [{"name": k, "type": docs.get(k, (type(d).__name__, ""))[0] or type(d).__name__,
             "default": d, "help": _plain(docs.get(k, ("", ""))[1])}
            for k, d in defaults.items()]


def _plain(text: str) -> str:
    """Docstring text without its reST markup (``x``, **x**, :class:`x`), for a terminal."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _fmt_default(v) -> str:
    return f"{v!r}" if isinstance(v, str) else f"{v}"


def _wrap(text: str, indent: int, width: int) -> str:
    return textwrap.fill(text, width=max(40, width), initial_indent=" " * indent,
                         subsequent_indent=" " * indent)


@list_.command(cls=JsonArgsCommand, epilog=EXAMPLES_POLICIES)
@click.argument("names", nargs=-1)
@json_option("the listing")
def policies(names, json_out):
    """Policies for --policy (sim, demo) and a rack file's [policy], with their parameters.

    NAMES limits the listing to those policies. A policy is given as NAME or
    NAME:key=value,key=value on the command line, or as keys of [policy] in a rack file.
    Kinds: server (runs in each server's gateway), client (runs in each client), central
    (an idealised scheduler, simulator only).
    """
    from malcolm.policy import registry
    try:
        chosen = [registry._info(n).name for n in names] or list(registry.POLICIES)
        rows = []
        for n in chosen:
            info = registry.POLICIES[n]
            rows.append({"name": n, "kind": info.kind, "help": info.help,
                         "params": policy_params(n)})
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if json_out:
        write_json(json_out, rows, indent=2)
        return
    width = min(100, shutil.get_terminal_size((100, 24)).columns)
    for r in rows:
        click.echo(f"{r['name']:<10} {r['kind']:<8} {r['help']}")
        for p in r["params"]:
            click.echo(f"    {p['name']} = {_fmt_default(p['default'])}  ({p['type']})")
            if p["help"]:
                click.echo(_wrap(p["help"], 8, width))
        if not r["params"]:
            click.echo("    (no parameters)")


# ----------------------------------------------------------------------------- workloads

@list_.command(epilog="""
\b
Examples:
  malcolm list workloads
  malcolm sim --workload bimodal
  malcolm sim --workload mix:90:const:50,10:exp:500
""")
@json_option("the listing")
def workloads(json_out):
    """Service-time workloads for --workload (sim, loadgen, demo): names and mixture syntax.

    Times are in µs. Each component of a mixture is a task type (the servers' estimator
    keeps one service-rate average per type).
    """
    from malcolm import workloads as wl
    rows = [{"name": k, "types": w.n_types, "mean_us": w.mean_us, "scv": w.scv,
             "components": [{"weight": float(p), "kind": c.kind, "a": c.a, "b": c.b}
                            for p, c in zip(w.weights, w.components, strict=True)],
             "describe": w.describe()} for k, w in wl.NAMED.items()]
    if json_out:
        write_json(json_out, {"named": rows, "forms": _workload_forms(wl)}, indent=2)
        return
    click.echo("Named workloads (service times in µs; SCV: squared coefficient of variation):")
    for r, w in zip(rows, wl.NAMED.values(), strict=True):
        mix = " + ".join(f"{100 * p:g}% {c.describe()}"
                         for p, c in zip(w.weights, w.components, strict=True))
        click.echo(f"  {r['name']:<10} mean {r['mean_us']:<6.4g} SCV {r['scv']:<6.3g} {mix}")
    click.echo("\nOther forms:")
    for f in _workload_forms(wl):
        click.echo(f"  {f['form']:<28} {f['help']}")


def _workload_forms(wl) -> list[dict]:
    forms = [{"form": "exp:MEAN", "help": "exponential with mean MEAN µs, one type"},
             {"form": "DIST", "help": "one type of any DIST below (const:5 is mix:1:const:5)"},
             {"form": "mix:W:DIST,W:DIST,...",
              "help": f"a mixture of at most {wl.MAX_COMPONENTS} types; weights W are "
                      "normalised; e.g. mix:90:const:50,10:exp:500"}]
    dist_help = {"const": ("const:V", "always V µs"),
                 "exp": ("exp:MEAN", "exponential, mean MEAN µs"),
                 "uniform": ("uniform:LO:HI", "uniform on [LO, HI] µs"),
                 "lognormal": ("lognormal:MEAN:SIGMA", "lognormal, mean MEAN µs, shape SIGMA")}
    for k in wl.DIST_PARAMS:       # an empirical sample has its own form, below
        form, text = dist_help[k]
        forms.append({"form": f"  DIST = {form}", "help": text})
    forms.append({"form": "empirical:FILE",
                  "help": "measured service times, µs, from a text file; one type"})
    return forms


# ------------------------------------------------------------------------------ handlers

_SPEC_LINE = re.compile(r"^``([^`]+)``\s*(.*)$")


def handler_specs() -> list[dict]:
    """The handler specs documented in :mod:`malcolm.workers.handlers`' docstring.

    Returns
    -------
    list of dict
        ``spec``, ``help`` and ``user`` (True for handlers the user writes).

    Raises
    ------
    ValueError
        The handlers module is not built.
    """
    try:
        from malcolm.workers import handlers
    except ImportError as e:
        raise ValueError(f"cannot import malcolm.workers.handlers ({e}); "
                         "is the extension built?") from None
    out: list[dict] = []
    user = False
    for ln in (handlers.__doc__ or "").splitlines():
        if ln.lower().startswith("user handlers"):
            user = True
        m = _SPEC_LINE.match(ln)
        if m:
            out.append({"spec": m.group(1), "help": m.group(2).strip(), "user": user})
        elif out and ln.startswith(" ") and ln.strip():
            out[-1]["help"] += " " + ln.strip()
    for o in out:
        o["help"] = re.sub(r"\s+", " ", _plain(o["help"])).strip().rstrip(";.") + "."
    return out


@list_.command(epilog="""
\b
Examples:
  malcolm list handlers
  handler = "sleep:spin_us=5"            (in a rack file: [rack] or one [[server]])
  handler = "so:/opt/lib/libmine.so:my_handler"
""")
@json_option("the listing")
def handlers(json_out):
    """Task handlers for a rack file's handler key: built-in ones and how to plug in your own.

    A user handler is a C function with the ABI of malcolm/workers/malcolm_handler.h
    (malcolm.get_include() gives its directory); see docs/handlers.md.
    """
    try:
        rows = handler_specs()
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if json_out:
        write_json(json_out, rows, indent=2)
        return
    width = 100
    for title, user in (("Built-in handlers:", False), ("Your own handler:", True)):
        click.echo(title)
        for r in (r for r in rows if r["user"] == user):
            click.echo(f"  {r['spec']}")
            click.echo(_wrap(r["help"], 6, width))
