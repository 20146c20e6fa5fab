"""MkDocs hooks (mkdocs.yml ``hooks:``): pages that are generated from the code at build time,
so that they cannot drift from it.

``<!-- malcolm:cli -->``        every ``malcolm`` command's ``--help``, from click itself;
``<!-- malcolm:rack-keys -->``  the rack file's keys and defaults, from ``malcolm.runtime.config``;
``<!-- malcolm:list NAME -->``  the output of ``malcolm list NAME``;
``<!-- malcolm:figures -->``    each ``bench/figures`` script's docstring, command and plots.
"""

from __future__ import annotations

import ast
import os
import re

import click
from click.testing import CliRunner


def _walk(cmd: click.Command, path: list[str], ctx_parent=None):
    ctx = click.Context(cmd, info_name=path[-1], parent=ctx_parent)
    yield path, cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(sub, path + [name], ctx)


def cli_reference() -> str:
    from malcolm.cli import main
    out = []
    for path, cmd, ctx in _walk(main, ["malcolm"]):
        level = "#" * min(len(path) + 1, 4)
        out.append(f"{level} `{' '.join(path)}`\n")
        text = cmd.get_help(ctx).replace("\b\n", "")
        out.append("```text\n" + text.rstrip() + "\n```\n")
    return "\n".join(out)


def rack_keys() -> str:
    from malcolm.runtime import config
    rows = ["| key | type | default |", "|---|---|---|"]
    for k, (typ, default) in config.RACK_KEYS.items():
        rows.append(f"| `{k}` | {typ.__name__} | `{default!r}` |")
    rows.append("")
    rows.append("Keys of one `[[server]]`: " + ", ".join(f"`{k}`" for k in
                                                       sorted(config.SERVER_KEYS)) + ".")
    return "\n".join(rows)


def list_output(what: str) -> str:
    from malcolm.cli import main
    r = CliRunner().invoke(main, ["list", what])
    if r.exit_code != 0:
        raise RuntimeError(f"malcolm list {what} failed: {r.output}")
    return "```text\n" + r.output.rstrip() + "\n```"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _images_of(stem: str, pngs: list[str]) -> list[str]:
    """The plots a script writes: ``fig2_1`` -> fig2_1.png; ``fig7_1_2`` -> fig7_1, fig7_2."""
    parts = stem.split("_")
    names = [stem]
    if len(parts) == 3 and parts[0].startswith("fig"):
        names = [f"{parts[0]}_{parts[1]}", f"{parts[0]}_{parts[2]}"]
    return [n + ".png" for n in names if n + ".png" in pngs]


def figures() -> str:
    fig_dir = os.path.join(ROOT, "docs", "figures")
    pngs = sorted(f for f in os.listdir(fig_dir) if f.endswith(".png"))
    scripts = sorted(f for f in os.listdir(os.path.join(ROOT, "bench", "figures"))
                     if f.endswith(".py") and f != "common.py")
    out, shown = [], set()
    for script in scripts:
        path = os.path.join(ROOT, "bench", "figures", script)
        with open(path) as f:
            doc = ast.get_docstring(ast.parse(f.read())) or script
        title, _, body = doc.partition("\n")
        out.append(f"## {title.rstrip('.')}\n\n{body.strip()}\n")
        out.append(f"```sh\npython3 bench/figures/{script} --outdir docs/figures"
                   "   # --quick: fewer points\n```\n")
        for png in _images_of(script[:-3], pngs):
            out.append(f"![{png}](figures/{png})\n")
            shown.add(png)
    rest = [p for p in pngs if p not in shown]
    if rest:
        out.append("## Other figures\n")
        out += [f"![{p}](figures/{p})\n" for p in rest]
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    if "<!-- malcolm:" not in markdown:
        return markdown
    markdown = markdown.replace("<!-- malcolm:cli -->", cli_reference())
    markdown = markdown.replace("<!-- malcolm:rack-keys -->", rack_keys())
    if "<!-- malcolm:figures -->" in markdown:
        markdown = markdown.replace("<!-- malcolm:figures -->", figures())
    return re.sub(r"<!-- malcolm:list (\w+) -->", lambda m: list_output(m.group(1)), markdown)
