"""Session fixtures for the mongodb backend's server (see tests/support.py:ServerInfo)."""
