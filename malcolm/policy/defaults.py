"""Defaults shared by both clocks: the simulator (``malcolm.sim``) and the runtime
(``malcolm.runtime``: the server and its rack files) import them from here, so they cannot drift.

Pure Python, so that configuration code imports it without the native build.

``EST_ALPHA``: weight of a new sample in the load estimator's moving averages. 0.05: a
worker's average forgets in about 20 of its own completions (1 ms of 50 µs tasks, ten 100 µs
windows), so a server that slows down is seen within a few windows; the server's rate sums
its workers, so with 8 workers the noise on exponential service times is about 6%. (The
runtime used 0.01, which takes five times longer to follow a change; every simulator figure
was made with 0.05. ``docs/simulator.md`` has the measurement.)

``EST_PRIOR_SERVICE_US``: the service time the estimator assumes before a worker's first
completion of a task type (the first sample then replaces it). The simulator uses the
workload's nominal mean instead, which it knows; a rack file may set ``prior_service_us``.

``STEALS_IN_FLIGHT``/``STEAL_TIMEOUT_US``: the runtime's rule for steal requests (one
outstanding, given up after 2 ms), which the simulator follows by default.
``MAX_STEALS_IN_FLIGHT`` is the most the simulator can track (``STEAL_MAX_IN_FLIGHT`` in
``driver.pxd``; a test checks they agree).

``WINDOW_TASKS``/``WINDOW_SHRINK``: a server's window (its heartbeat period and policy step)
is ``WINDOW_TASKS`` of its own measured task times, at most the configured window
(``window_us``) and at least that over ``WINDOW_SHRINK`` (``drv_window_ns`` in
``driver.pxd``, which holds the same bound). With the thesis's 50 µs tasks and 100 µs window
nothing changes; 5 µs tasks get 25 µs windows. 0 tasks: the configured window, fixed.
"""

EST_ALPHA = 0.05
EST_PRIOR_SERVICE_US = 50.0
STEALS_IN_FLIGHT = 1
STEAL_TIMEOUT_US = 2000.0
MAX_STEALS_IN_FLIGHT = 16
WINDOW_TASKS = 5.0
WINDOW_SHRINK = 5
MAX_WINDOW_TASKS = 1e6          # the most a window_tasks may be (both clocks, the CLI)
