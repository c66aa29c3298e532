"""Deliberately broken backends for the conformance kit's own tests (see README.md)."""

from __future__ import annotations

from checkpoint_stores import BackendRegistry, hookimpl

__all__ = ["plugin"]


class _Plugin:
    @hookimpl
    def checkpoint_stores_register_backends(self, registry: BackendRegistry) -> None:
        """Register one scheme per bug."""
        for scheme, cls in (
            ("broken-head", "BrokenHeadBackend"),
            ("broken-prefix", "BrokenPrefixBackend"),
            ("broken-create", "BrokenCreateBackend"),
            ("broken-seq", "BrokenSeqBackend"),
            ("broken-file-head", "BrokenFileHeadBackend"),
        ):
            registry.add(scheme, f"broken_store.backends:{cls}", description="deliberately broken")


plugin = _Plugin()
