"""The conformance kit (work in progress; see issue 3)."""
