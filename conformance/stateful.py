"""Group 5: a Hypothesis state machine drives the backend and a dict model side by side.

Rules call ``put``, ``create``, ``commit``, ``delete``, ``delete_prefix``,
``delete_thread``, ``get``, ``get_many`` and ``list`` on two threads with
keys chosen to collide under wildcards, NUL and Unicode normalization; every
answer is compared with the model's. When they differ, Hypothesis shrinks the
run to the shortest sequence of calls that shows it and prints it.
"""

from __future__ import annotations

from typing import Any

from checkpoint_stores.conformance.checks import check
from checkpoint_stores.conformance.context import CheckContext

__all__ = ["StatefulChecks"]

_KEYS = (
    "a",
    "a%",
    "a_",
    "ab",
    "a%b",
    "b",
    "b*",
    "b[",
    "\x00",
    "\x00a",
    "\u00e9",
    "e\u0301",
    "\U0001f600",
    "head",
    "head2",
)
_PREFIXES = ("", "a", "a%", "a_", "b", "b[", "\x00", "e", "\u00e9", "\U0001f600", "h", "zz")
_HEADS = ("head", "head2")

# thread -> key -> (value, seq); seq None for values written by put/create/commit writes.
_Model = dict[str, dict[str, tuple[bytes, int | None]]]


class StatefulChecks:
    """Group 5 of the kit (``conformance_stateful``). Mixed into ``StoreConformance``."""

    #: Hypothesis examples (each a fresh pair of threads) and steps per example.
    stateful_max_examples: int = 25
    stateful_step_count: int = 30

    @check("stateful.matches_dict_model")
    def test_stateful_matches_dict_model(self, ctx: CheckContext) -> None:
        """every SPI call answers as a dict model would, over any sequence of calls"""
        from hypothesis import HealthCheck, settings
        from hypothesis import strategies as st
        from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

        backend = ctx.backend
        thread_no = st.integers(0, 1)
        keys = st.sampled_from(_KEYS)
        values = st.binary(max_size=24)

        class StoreModel(RuleBasedStateMachine):
            def __init__(self) -> None:
                super().__init__()
                self.threads = [ctx.thread("sm"), ctx.thread("sm")]
                self.model: _Model = {t: {} for t in self.threads}

            def _rows(self, t: int) -> dict[str, tuple[bytes, int | None]]:
                return self.model[self.threads[t]]

            def _same(self, call: str, got: Any, want: Any) -> None:
                ctx.expect(
                    got == want, f"{call} returned {got!r:.300}, the model says {want!r:.300}"
                )

            @rule(t=thread_no, key=keys, value=values)
            def put(self, t: int, key: str, value: bytes) -> None:
                ctx.run(backend.put(self.threads[t], key, value))
                self._rows(t)[key] = (value, None)

            @rule(t=thread_no, key=keys, value=values)
            def create(self, t: int, key: str, value: bytes) -> None:
                got = ctx.run(backend.create(self.threads[t], key, value))
                rows = self._rows(t)
                want = key not in rows
                if want:
                    rows[key] = (value, None)
                self._same(f"create(t{t}, {key!r})", got, want)

            @rule(
                t=thread_no,
                head=st.sampled_from(_HEADS),
                writes=st.dictionaries(keys.filter(lambda k: k not in _HEADS), values, max_size=3),
                value=values,
                seq=st.integers(0, 12),
            )
            def commit(
                self, t: int, head: str, writes: dict[str, bytes], value: bytes, seq: int
            ) -> None:
                got = ctx.run(
                    backend.commit(self.threads[t], list(writes.items()), head, value, seq)
                )
                rows = self._rows(t)
                current = rows.get(head)
                want = current is None or current[1] is None or current[1] < seq
                if want:
                    for key, data in writes.items():
                        rows[key] = (data, None)
                    rows[head] = (value, seq)
                self._same(f"commit(t{t}, head={head!r}, seq={seq})", got, want)

            @rule(t=thread_no, key=keys)
            def delete(self, t: int, key: str) -> None:
                got = ctx.run(backend.delete(self.threads[t], key))
                self._same(f"delete(t{t}, {key!r})", got, self._rows(t).pop(key, None) is not None)

            @rule(t=thread_no, prefix=st.sampled_from(_PREFIXES[1:]))
            def delete_prefix(self, t: int, prefix: str) -> None:
                got = ctx.run(backend.delete_prefix(self.threads[t], prefix))
                rows = self._rows(t)
                doomed = [k for k in rows if k.startswith(prefix)]
                for key in doomed:
                    del rows[key]
                self._same(f"delete_prefix(t{t}, {prefix!r})", got, len(doomed))

            @rule(t=thread_no)
            def delete_thread(self, t: int) -> None:
                got = ctx.run(backend.delete_thread(self.threads[t]))
                rows = self._rows(t)
                want = len(rows)
                rows.clear()
                self._same(f"delete_thread(t{t})", got, want)

            @rule(t=thread_no, key=keys)
            def get(self, t: int, key: str) -> None:
                got = ctx.run(backend.get(self.threads[t], key))
                row = self._rows(t).get(key)
                self._same(f"get(t{t}, {key!r})", got, None if row is None else row[0])

            @rule(t=thread_no, many=st.lists(keys, max_size=4))
            def get_many(self, t: int, many: list[str]) -> None:
                got = ctx.run(backend.get_many(self.threads[t], many))
                rows = self._rows(t)
                want = [rows[k][0] if k in rows else None for k in many]
                self._same(f"get_many(t{t}, {many!r})", got, want)

            @rule(t=thread_no, prefix=st.sampled_from(_PREFIXES))
            def list(self, t: int, prefix: str) -> None:
                async def collect() -> Any:
                    return [item async for item in backend.list(self.threads[t], prefix)]

                got = ctx.run(collect())
                rows = self._rows(t)
                want = sorted((k, v) for k, (v, _) in rows.items() if k.startswith(prefix))
                self._same(f"list(t{t}, prefix={prefix!r})", got, want)

            def teardown(self) -> None:
                for thread in self.threads:
                    ctx.run(backend.delete_thread(thread))

        run_state_machine_as_test(
            StoreModel,
            settings=settings(
                max_examples=self.stateful_max_examples,
                stateful_step_count=self.stateful_step_count,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
