"""Benchmarks that the CLI runs (``malcolm bench ...``).

pytest-benchmark suites and the figure scripts live in the repository's ``bench/`` folder; this
package holds the benchmark code that ships with malcolm so that ``malcolm bench`` works from an
installed wheel.
"""
