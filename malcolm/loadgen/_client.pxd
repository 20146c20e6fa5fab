# cython: language_level=3
"""The load generator's native client: its constants and counters (``_client.pyx``)."""
from libc.stdint cimport uint64_t

from malcolm.policy.base cimport MAX_SERVERS


cdef enum:
    MAX_PHASES = 64
    MAX_SEGMENTS = 256
    N_STATUS = 7
    # request states in the window
    R_FREE = 0
    R_OUT = 1           # sent in the measured interval, not answered yet
    R_OUT_WARM = 2      # sent during warm-up
    R_DONE = 3          # answered (any status)
    R_TIMED_OUT = 4     # given up on by the client
    # arrival processes
    A_POISSON = 0
    A_FIXED = 1
    A_TRACE = 2
    # payload sizes and contents
    PS_FIXED = 0
    PS_UNIFORM = 1
    PS_EXP = 2
    PC_ZEROS = 0
    PC_RANDOM = 1
    PC_PATTERN = 2


ctypedef struct Counts:
    uint64_t sent
    uint64_t sent_warm
    uint64_t completed              # status ok, measured
    uint64_t rejected[N_STATUS]     # by status (index 0 unused), measured
    uint64_t timed_out              # no response within the timeout, measured
    uint64_t warm_answered
    uint64_t warm_timed_out
    uint64_t migrated               # completed tasks that carried the migrated flag
    uint64_t stolen
    uint64_t late                   # responses that came after their task timed out
    uint64_t duplicates             # second answers to a task (a different message)
    uint64_t replayed               # copies of the answer already taken (same epoch, seq)
    uint64_t unknown                # responses to ids this client never sent (or too old)
    uint64_t foreign                # responses for another client id
    uint64_t malformed
    uint64_t forged                 # responses whose MAC did not verify (not the rack's key)
    uint64_t unexpected             # valid messages that are not responses
    uint64_t send_failed
    uint64_t window_full            # tasks given up early because the window was full
    uint64_t late_sends             # sends later than lag_threshold behind schedule
    uint64_t late_episodes          # runs of consecutive late sends
    uint64_t svc_req_ns             # sum of the service times asked for, measured sends
    uint64_t svc_ns                 # sum of the service times servers measured, completed
    uint64_t payload_bytes          # payload bytes sent, measured sends
    uint64_t echo_checked           # completed responses checked against the pattern
    uint64_t echo_bad               # ... whose payload was not the pattern of their task
    uint64_t sent_to[MAX_SERVERS]
    uint64_t answered_by[MAX_SERVERS]


# Per segment of the measured interval (by intended send time): what a long run needs to see
# drift (latency, losses, moves) over time rather than one figure for the whole run.
ctypedef struct SegCounts:
    uint64_t sent
    uint64_t completed
    uint64_t rejected[N_STATUS]     # by status (index 0 unused)
    uint64_t timed_out
    uint64_t late_sends
    uint64_t migrated
    uint64_t stolen
