"""Session fixtures for the s3 backend's server (see tests/support.py:ServerInfo)."""
