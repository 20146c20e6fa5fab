"""The server runtime: one malcolm server on a real clock, and the tools to run a rack of them.

``server`` (the :class:`~malcolm.runtime.server.Server` object), ``gateway`` (the thread that
owns the transport), ``policy_thread`` (the window loop), ``config`` (rack files) and
``launcher`` (a rack of ``malcolm serve`` processes on this host). The worker pool is
``malcolm.workers.pool``, next to the handlers.
"""
