"""The thesis-figure scripts run end to end (tiny sizes) and write their CSV and PNG."""

import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name,rows", [("fig2_1", 56), ("fig2_3", 60), ("fig3_2", 16)])
def test_figure_script(tmp_path, name, rows):
    script = os.path.join(ROOT, "bench", "figures", f"{name}.py")
    res = subprocess.run([sys.executable, script, "--quick", "--tasks", "2000", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(tmp_path / f"{name}.csv") as f:
        data = list(csv.DictReader(f))
    assert len(data) == rows
    assert all(float(r["p99_us"]) > 0 for r in data)
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000
