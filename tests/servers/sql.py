"""Session fixtures for the sql backend's server (see tests/support.py:ServerInfo)."""
