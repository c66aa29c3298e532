"""Session fixtures for the redis backend's server (see tests/support.py:ServerInfo)."""
