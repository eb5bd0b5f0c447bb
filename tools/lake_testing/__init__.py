"""Test fixtures that start real Lake processes and servers on loopback."""
