"""Bounds of the transports that other layers check against: one definition each, so that a
rack file's ranges (``malcolm.runtime.config.RACK_RANGES``) and the transports' own checks
(``malcolm.net.transport``) cannot drift apart. Pure Python: the rack file's parser imports
it without loading the native modules."""

# the most messages an shm ring holds (a power of two, like every ring size): 2^20 messages
# of the ring's slot size are already hundreds of MB of /dev/shm per server
MAX_SHM_CAPACITY = 1 << 20
