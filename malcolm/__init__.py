"""malcolm: a multi-agent learning load balancer for microsecond-scale services at rack scale."""

__version__ = "0.1.0"
