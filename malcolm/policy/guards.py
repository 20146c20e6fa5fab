"""The guards of Malcolm's agent in words: which of ``AgentState.stats``' counters say a guard
fired, and the one wording of ``malcolm serve``'s log, ``malcolm sim``'s report and the demo's
run lines. Pure Python, so that the command line reads it without the native policy."""

# The counters of ``AgentState.stats`` that say a guard fired (worth a line in a log): the
# key and what one count is.
GUARDS = (("resets", "runaway reset(s) of the actors"),
          ("shed_count", "arrival(s) sent on from a long queue (the shed rule)"),
          ("consensus_rejected", "peer critic(s) refused in consensus"),
          ("hb_clamped", "heartbeat field(s) clamped to sane bounds"))


def guards_text(counts):
    """``counts`` (a guard's key: how often it fired) in words, in :data:`GUARDS`' order:
    "2 runaway reset(s) of the actors, ..." ('' where none fired)."""
    return ", ".join(f"{counts[k]} {what}" for k, what in GUARDS if counts.get(k, 0) > 0)
