"""``bench/room_bound.py``: the lower bound of any policy's p99 on a sweep rack holds."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from room_bound import forwarded_share  # noqa: E402


def test_forwarded_share():
    assert forwarded_share("1x8,1x8", 0.9) == 0.0          # nobody above its capacity
    # 1x1 among four 1x8 at 0.52: it reaches 1/5 of the tasks and can keep 1/(33 * 0.52)
    assert abs(forwarded_share("1x8,1x8,1x8,1x8,1x1", 0.52) - (0.2 - 1 / (33 * 0.52))) < 1e-12
    assert forwarded_share("1x2@2.0,1x4", 0.9) == 0.0       # speeds count in the capacity


def test_bound_holds_for_learnt_and_frozen():
    # sweep scenario 59 (1x15 x3 + 1x2, Bimodal at 0.41), short: every p99 >= its bound
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "room_bound.py"), "--ids",
                        "59", "--seeds", "1", "--tasks-mult", "0.05", "--procs", "1"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    m = re.search(r"p99 learnt\s+([\d.]+) frozen\s+([\d.]+) bound\s+([\d.]+)", r.stdout)
    assert m, r.stdout
    learnt, frozen, bound = map(float, m.groups())
    assert bound >= 500.0 + 3 * 5.41 - 1e-6            # f = 0.146 > 10%: a long task's hop
    assert learnt >= bound - 1e-6 and frozen >= bound - 1e-6


def test_bad_id_is_one_line():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "room_bound.py"), "--ids",
                        "999999"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
