# cython: language_level=3
"""The state of Malcolm's agent: memory, what it knows about the rack, derived quantities.

See ``agent_state.pyx``; the learning agent is ``actor_critic.MalcolmPolicy``.
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from malcolm._core cimport Categorical
from malcolm.policy.base cimport MAX_SERVERS, Policy


cdef enum:
    # The sparse actors' inputs (deviations from the rack's mean load, in tasks of an average
    # server) are clipped to +-ZCLIP; the trust region scales the weights' range by it.
    ZCLIP = 4


ctypedef struct PeerRec:
    # The head of a peer's row (``peer_rows``), before the critic its last heartbeat carried.
    # observe_peer only writes the row: what it reads of a peer (its sequence number in
    # pseq, whether it was seen in known) lies in denser arrays that stay in cache, where a
    # record read per heartbeat missed on most of them (each row is written a window after
    # the last look).
    uint32_t theta_ok   # its critic (_peer_theta): 0 none or refused, 1 received, 2 checked, ok
    uint32_t _pad


cdef class AgentState(Policy):
    # What every heartbeat reads and writes (observe_peer, n - 1 times per window), first
    # and together: spread over the object they cost a cache line each per heartbeat on a
    # 64-server rack (docs/policy-log.md "Scale: earlier sessions", sixth session). Read-mostly
    # first, then the fields observe_peer writes.
    cdef readonly int64_t window_ns
    cdef readonly double load_scale    # ns per unit of scaled load (derived when auto_scale)
    cdef readonly double load_clip
    cdef double* x                       # loads in ns (last known)
    # scaled, clipped loads: the actors' inputs; with the sparse actors computed from x where
    # read (_actor_inputs, _features), not in each heartbeat
    cdef double* u
    cdef uint8_t* known                  # a load for this server has been seen
    # 3n: marginal advantages (migrate, steal) at the last publish, then each server's rate
    # (tasks/ns)
    cdef double* adv
    # n rows of peer_row doubles, one per peer: its PeerRec (one double), then the
    # latest critic it sent (n_theta doubles, _peer_theta); peer_row rounds the row up to
    # whole cache lines (8: d <= 7)
    cdef double* peer_rows
    cdef int peer_row
    # n: the last heartbeat's sequence number (known); then n more, the number at the last
    # window's end (mc_pub_peer_ages)
    cdef uint32_t* pseq
    # 2n: each peer's cumulative migrations and steals, (mig, stl) pairs: as its last
    # heartbeat reported them, and as they stood at the last window's end (_peer_moves)
    cdef uint64_t* pcnt
    cdef uint64_t* pbase
    # n: each peer's speed code (0: not known, and at me), apart from PeerRec so that the
    # publish's scan reads two cache lines on 64 servers, not one per peer
    cdef uint16_t* pcode
    cdef readonly int n_theta       # critic features: 5, or 2n + 2 with per_server features
    cdef bint sparse
    cdef readonly bint auto_hop
    cdef double hop_est                  # EWMA of measured one-way heartbeat delays (ns)
    cdef bint hop_seen
    cdef bint sorted_ok                  # srt reflects the current loads
    cdef readonly uint64_t hb_clamped          # heartbeat fields clamped to sane bounds
    cdef readonly uint64_t hb_lost             # heartbeats lost: the sequence numbers' gaps

    # configuration (read-only from Python)
    cdef readonly int batch_windows
    cdef readonly int learn_every        # the gradient of one window in learn_every
    cdef readonly int consensus_every
    cdef readonly double gamma
    cdef readonly double critic_lr
    cdef readonly double actor_lr
    cdef readonly double cold_lr         # the biases' rate through the first beta2_steps steps
    cdef readonly double accept_lr
    cdef readonly double weight_lr
    cdef bint weight_lr_auto     # weight_lr < 0 given: it follows actor_lr
    cdef readonly double hop_weight
    cdef readonly double hop_cap
    cdef readonly double weight_decay
    cdef readonly double beta1
    cdef readonly double beta2
    cdef readonly double beta2_decay     # c: beta2 at step t is min(beta2, 1 - t^-c); 0: beta2
    cdef readonly uint64_t beta2_steps   # ... for steps t <= this (UINT64_MAX: all)
    cdef readonly double eps
    cdef readonly double migration_cost
    cdef readonly double steal_cost
    cdef readonly double entropy
    cdef readonly bint auto_scale      # load_scale=0: derived from the reported service rates
    cdef readonly double hop_ns        # one-way hop cost in ns (measured when auto_hop)
    cdef readonly double mask_factor   # never migrate to j with v_j > max(v_me, f * mean + s_j)
    cdef readonly double trust         # actors stay within this (logit units) of the safe init
    cdef readonly int runaway_windows  # own runaway queue this many windows -> reset actors
    cdef readonly double theta_bound   # peers' critic norm bound for consensus
    cdef readonly str consensus        # "median" (robust) or "mean" (the thesis)
    cdef bint cons_median
    cdef readonly bint capacity_prior  # migrate logits += log(rate_j / mean rate)
    cdef readonly bint hop_gate        # accept while a local task waits no longer than a hop
    cdef readonly double init_scale
    cdef readonly str init
    cdef readonly str actor_input  # "absolute" (u) or "relative" (u_j - u_me)
    cdef bint rel_input
    cdef readonly str actor          # "sparse" (default, O(n)) or "full" (the thesis's W)
    cdef readonly str advantage    # "td" (delta * (k/K - pi)) or "marginal" (see docstring)
    cdef bint marginal               # "marginal" or "difference"
    cdef bint adv_next               # "difference": advantages at the end-of-window state
    cdef readonly double herd        # the herd term's weight (0: off; _marginal_advantages)
    cdef readonly double herd_busy   # its busy share's power (mc_busy_share; 0: unscaled)
    cdef double rack_mig             # the rack's migrations in the last window (own + peers')
    cdef public bint learn

    # sizes
    cdef readonly str features_kind
    cdef bint symmetric
    cdef readonly int n_params      # d + 2 (n*n + n): the dense layout ``params`` shows
    cdef int off_wm, off_bm, off_ws, off_bs
    # In memory each W block is n*n (dense actors, column-major) or, for the sparse actors,
    # 2n: the diagonal, then column me (the only weights they use; W[me, me] lives in the
    # column, its diagonal slot stays 0). W[j, j] is at w + wdiag * j for j != me, W[j, me]
    # at w + wcol + j (both layouts); n_mem parameters in all.
    cdef int wcol, wdiag, n_mem

    # the two actors' distributions (policy thread writes, gateway samples)
    cdef Categorical mig
    cdef Categorical stl
    cdef bint cats_ready

    # parameters and AdamW state, one contiguous block each (n_mem): [theta | Wm | Bm | Ws | Bs]
    cdef double* P
    cdef double* P0                      # the safe initial parameters (trust region centre)
    cdef double* G                       # cached descent gradients of the current batch
    cdef double* M
    cdef double* V
    cdef double b1t, b2t                 # the products of beta1 and of beta2 so far
    cdef readonly uint64_t adam_steps

    # what the agent knows about the rack, refreshed by observe_* (policy thread)
    cdef double queue_len, rate
    cdef int64_t last_now

    # state at the last publish: the window's decisions were drawn from these
    cdef double* u_pub
    cdef double* feat_prev
    cdef double* feat_cur
    cdef double* pm_pub
    cdef double* ps_pub
    cdef double* coef                    # per-outcome scratch of the actor gradient
    cdef bint has_prev
    cdef double* srt                     # known loads v = x / load_scale, sorted ascending
    cdef double* pre                     # prefix sums of srt (n + 1)
    cdef double* fv                      # _marginal_advantages scratch: F at srt[p]
    # 2n: the sparse actors' diagonal gradients (W_jj, migrate then steal) of the current
    # batch, contiguous: in G they lie n + 1 doubles apart, a cache line each, touched in
    # every sampled window. Folded into G (whose diagonal is 0 meanwhile) before AdamW
    cdef double* gdiag
    cdef int nsrt
    cdef int* ord                        # server indices in the last sorted order
    cdef int* pos                        # pos[j]: j's index in srt (known j)
    cdef double* g_pub                   # 2n: the learned logit parts at publish (mig, stl)
    # 6n: what the sparse actors' logits read, gathered from P by _push_params into one
    # block, [B_j | W_jj | W_j,me (0 at j = me)] for migrate, then the same for steal. In P
    # the diagonal lies n + 1 doubles apart (a cache line each) and the four runs in four
    # pages; _publish reads them every window (on 64 servers the diagonal's 128 misses per
    # window were its largest cost)
    cdef double* act
    # the capacity tilt (tilt_lr > 0): migrate logit_j += tilt * tl_j, tl_j = log r_j - the
    # peers' mean log rate at the last publish (0: accepting, no rate); one scalar learnt
    # from every outcome's gradient: a preference keyed to what a peer is, not which
    cdef readonly double tilt_lr
    cdef readonly double tilt_max        # |tilt| bound while the trust region is on
    cdef bint use_tilt
    cdef readonly double tilt
    cdef double tilt_g, tilt_m, tilt_v   # its cached gradient and AdamW moments
    cdef double* tl
    cdef double* logit                   # publish scratch: f + capacity prior, masked
    cdef double* med                     # consensus scratch (64 rows of 8 values)
    cdef int runaway_run                 # consecutive windows with a runaway own queue
    cdef double runaway_last
    # lost heartbeats (item 22): per peer, when its sequence number last advanced and its
    # heartbeat period in ns (2n, mc_pub_peer_ages; the number at that look is in pseq's
    # second half); n_stale: the peers that sent nothing for (1 + stale_after) periods. While
    # every known peer is stale, no load steers the actors (their inputs are 0).
    # Only once a heartbeat was lost (hb_lost): without loss no report is stale, and the pass
    # would cost 3-4% of a 64-server simulation for nothing
    cdef double* pbeat
    cdef int n_stale
    cdef readonly double stale_after
    # the hop gate: the policy publishes (sequence << 32 | K); the gateway accepts the first
    # K arrivals after each publish outright (gate_epoch, gate_used: gateway-owned)
    cdef uint64_t gate_pub
    cdef uint64_t gate_seq
    cdef double gate_carry               # the budgets' fractional parts carried (dithering)
    cdef uint64_t gate_epoch
    cdef uint64_t gate_used
    cdef readonly bint gate_live       # gate: K (signed) + completions - accepts since publish
    cdef bint live                       # gate_live and hop_gate: the gateway runs it
    cdef int64_t gate_done               # completions seen since the publish (gateway-owned)
    # the shed rule and idle-only steals (gate_live only; the rule on by default only for a
    # runaway queue, shed_runaway): the policy publishes the threshold T, the gateway sends
    # an arrival away while the budget is <= T
    cdef readonly double shed            # its margin, in own task times (< 0: off)
    cdef readonly double shed_runaway    # ... or this many a worker, whichever is less (0: off)
    cdef uint64_t shed_pub               # T as a signed 32-bit number in the low half
    cdef readonly uint64_t shed_count    # arrivals the rule sent to a peer (gateway)
    cdef readonly bint steal_idle        # steal only while the budget is >= 1 ...
    # ... or above a lower bar for a victim loaded above the rack's mean: per victim, the
    # least budget (signed 32-bit in the low half) at which a steal from it goes ahead
    cdef uint64_t steal_pub[MAX_SERVERS]

    # decisions taken by the gateway: cumulative counts per outcome (gateway writes only)
    cdef uint64_t* cnt_mig
    cdef uint64_t* cnt_stl
    cdef uint64_t* seen_mig              # snapshot at the last end_window (policy thread)
    cdef uint64_t* seen_stl
    cdef uint64_t own_mig_seen, own_stl_seen   # Policy.migrations/steals at the last window
    # steal_state="decision": where the gateway's steals went ahead. Sums of (arrivals kept -
    # completions since the publish), the live gate's own-queue change, at each steal that
    # went ahead, and their count (gateway writes only); their snapshots at the last window;
    # the own queue at the last publish (policy thread)
    cdef readonly str steal_state
    cdef bint stl_at_decision
    cdef uint64_t stl_dq, stl_dn
    cdef uint64_t stl_dq_seen, stl_dn_seen
    cdef double q_gate
    # steal_grant (hops) + grant_tasks (own mean task times); both 0: off: the victim's bar
    # on waiting work, published in ns
    cdef readonly double steal_grant
    cdef readonly double grant_tasks
    cdef uint64_t grant_pub
    cdef readonly uint64_t grant_refused     # steal requests answered empty by the bar

    # peers, from heartbeats only
    cdef uint32_t hb_seq

    # learning diagnostics
    cdef readonly uint64_t windows
    cdef readonly uint64_t batches
    cdef readonly uint64_t consensus_rounds
    cdef readonly double last_td_error
    cdef readonly double last_payoff
    cdef readonly double last_imbalance
    cdef readonly double last_cost
    cdef readonly uint64_t resets              # runaway resets of the actors
    cdef readonly uint64_t consensus_rejected  # peers' critics refused (non-finite, too large)
    cdef readonly uint64_t masked              # migrate outcomes masked at publish (summed)
    cdef readonly uint64_t trust_clips         # actor parameters clipped to the trust region
    cdef readonly uint64_t gated             # arrivals the hop gate accepted (gateway)
    cdef int win_in_batch                # windows whose gradient the batch holds
    cdef int batch_clock                 # windows since the last AdamW step
    cdef int learn_clock                 # windows since the last sampled one

    # speeds (speed_band; last, after the fields the hot paths read together): the own
    # speed (observe_completions) as sums over the last SPEED_TASKS or so completions, each
    # older one decayed, and the totals they were taken from
    cdef readonly double speed_band      # the gate weighs per-task speeds beyond this ratio
    cdef readonly bint gate_residual     # the hop gate counts the first departure's residual
    cdef int speed_band_lg               # the band in speed-code units (< 0: off)
    cdef uint64_t sp_n_seen
    cdef double sp_l_seen, sp_s_seen, sp_w, sp_l, sp_s
    cdef readonly int svc_lg             # the speed code the heartbeat carries (0: not yet)
    cdef readonly double svc_mean_ns     # the mean service time over the same completions
    cdef readonly uint64_t speed_slower      # publishes whose gate the peers' speeds lowered
    cdef bint sp_closed                  # the last publish's gate was closed by the speeds

    cdef int _alloc(self, int d) except -1
    cdef void _release(self) noexcept
    cdef void _set_load(self, int j, double load) noexcept nogil
    cdef void _actor_inputs(self, double* z) noexcept nogil
    cdef void _marginal_advantages(self, bint do_mig, bint do_stl) noexcept nogil
    cdef void _features(self, double* out) noexcept nogil
    cdef void _sort_loads(self) noexcept nogil
    cdef void _fold_gdiag(self, double* g, bint clear) noexcept nogil

    cdef inline int _wd(self, int w, int j) noexcept nogil:
        """Where W[j, j] of the W block at ``w`` is (W[me, me]: in column me)."""
        return w + self.wcol + j if j == self.me else w + self.wdiag * j
    cdef inline PeerRec* _peer(self, int j) noexcept nogil:
        """Peer j's record (the head of its row in ``peer_rows``)."""
        return <PeerRec*>(self.peer_rows + <Py_ssize_t>j * self.peer_row)

    cdef inline double* _peer_theta(self, int j) noexcept nogil:
        """The latest critic peer j sent (n_theta doubles, after its record)."""
        return self.peer_rows + <Py_ssize_t>j * self.peer_row + sizeof(PeerRec) // 8

    cdef void _peer_critics_checked(self) noexcept nogil
    cdef void _push_params(self) noexcept nogil
    cdef void _rescale(self) noexcept nogil
    cdef double _hop_units(self) noexcept nogil
    cdef void _decisions_counted(self) noexcept nogil
    cdef void _peer_moves(self, uint64_t* mig, uint64_t* stl) noexcept nogil
    cdef double _steal_load(self, double vme, double sme) noexcept nogil
    cdef void _learned_logits(self) noexcept nogil
    cdef void _tilt_logits(self) noexcept nogil
    cdef void _migrate_weights(self, double* w) noexcept nogil
    cdef void _steal_weights(self, double* w) noexcept nogil
    cdef void _publish_only(self, double* p) noexcept nogil
