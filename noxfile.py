"""Sessions: ``nox -s tests`` (the whole suite, as CI runs it), ``lint``, ``typecheck``, ``bench``.

Every session installs the package as a wheel would (not editable), so the
tests see what users get.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = False

# Worked third-party plugins the kit is proven against (installed into the test venv).
EXAMPLES = ["./examples/third_party_store", "./examples/broken_store"]


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite against real servers; a skipped backend fails the run."""
    session.install(".[test]")
    for example in EXAMPLES:
        if os.path.isdir(example):
            session.install(example)
    env = {
        "CHECKPOINT_STORES_REQUIRE_BACKENDS": os.environ.get(
            "CHECKPOINT_STORES_REQUIRE_BACKENDS", "1"
        )
    }
    session.run("python", "-m", "pytest", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the installed package."""
    session.install(".[all]", "mypy>=1.10", "types-aiobotocore[s3]")
    session.run("mypy", "-p", "checkpoint_stores")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: ratios against the raw driver doing the same work, in one run."""
    session.install(".[all]", "moto[s3]>=5.0", "flask>=3", "flask-cors>=4", "secantusdb>=0.7.0b3")
    # Benchmark-only: the SQL benchmark compares against LangGraph's AsyncPostgresSaver.
    session.install("langgraph-checkpoint-postgres>=2")
    session.run("python", "-m", "benchmarks", *session.posargs)
