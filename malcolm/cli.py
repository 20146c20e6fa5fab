"""The ``malcolm`` command line. Each subcommand lives in ``malcolm/commands/<name>.py`` and is
imported only when it is used, so ``malcolm --help`` stays fast and a broken optional part
(the RDMA transport, say) cannot take the whole CLI down."""

import importlib
import os

# Malcolm does no dense linear algebra, but numpy's OpenBLAS starts a thread per core at
# import, and they spin for ~0.1 s of CPU each before sleeping: on a 2-core machine that is a
# core taken from the command itself, and on a server, from pinned workers. One thread, unless
# the user asked for more. Set before any subcommand imports numpy; children inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # noqa: E402

from malcolm import __version__  # noqa: E402

# name -> (module, attribute, one-line help)
COMMANDS = {
    "bench": ("malcolm.commands.bench", "bench", "Microbenchmarks of the native core and runtime."),
    "sim": ("malcolm.commands.sim", "sim", "Simulate a rack under a load-balancing policy."),
    "serve": ("malcolm.commands.serve", "serve", "Run one server of a rack (real runtime)."),
    "rack": ("malcolm.commands.rack", "rack", "Start a local rack, or check a rack file."),
    "loadgen": ("malcolm.commands.loadgen", "loadgen", "Open-loop load generator for a rack."),
    "rocksdb": ("malcolm.commands.rocksdb", "rocksdb", "The RocksDB GET(n) service: build, time."),
    "demo": ("malcolm.commands.demo", "demo", "Main job: a small rack, Malcolm vs baselines."),
    "list": ("malcolm.commands.list", "list_", "List policies, workloads, handlers and their "
             "parameters."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        mod, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="""
\b
Examples:
  malcolm demo                          the main job: a local rack, Malcolm vs baselines
  malcolm sim --policy malcolm          simulate a rack
  malcolm list policies                 every policy and its parameters
  malcolm rack gen --slurm -o rack.toml a rack file for this Slurm job's nodes
  malcolm serve --rack rack.toml        one server (its rank from Slurm or MPI)
""")
@click.version_option(__version__, prog_name="malcolm")
def main():
    """Malcolm balances load across the servers of a rack at microsecond scale."""
