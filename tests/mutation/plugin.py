"""Pytest plugin: run the session with one hand-made mutant applied.

``MC_MUTANT=<id> pytest -p tests.mutation.plugin ...`` installs the mutant
(``tests.mutation.catalogue``) before the first conftest (and so any project
module) is imported, then
imports the mutated modules at once, so a stale mutant (its text no longer
in the source) stops the session with a usage error instead of passing as a
survivor. A Lua mutant is also loaded into the test Redis
(``MC_TEST_REDIS_URL``) first: a mutant that does not compile is reported as
invalid, not as killed. Without ``MC_MUTANT`` the plugin does nothing.
"""

from __future__ import annotations

import importlib
import os

import pytest

ENV = "MC_MUTANT"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    mutant_id = os.environ.get(ENV, "")
    if not mutant_id:
        return
    from tests.mutation.catalogue import BY_ID
    from tests.mutation.hook import MutantNotApplicable, install

    mutant = BY_ID.get(mutant_id)
    if mutant is None:
        raise pytest.UsageError(f"{ENV}={mutant_id}: no such mutant")
    try:
        finder = install(mutant.edits)
        for module in sorted(finder.modules):
            importlib.import_module(module)
    except MutantNotApplicable as exc:
        raise pytest.UsageError(f"mutant {mutant_id} is stale: {exc}") from None
    if mutant.kind == "lua":
        _load_scripts(mutant_id)
    early_config.stash[_APPLIED] = mutant_id


_APPLIED = pytest.StashKey[str]()


def _load_scripts(mutant_id: str) -> None:
    url = os.environ.get("MC_TEST_REDIS_URL")
    if not url:
        return
    import redis

    from backends.redis import SCRIPTS

    with redis.Redis.from_url(url, socket_timeout=10) as client:
        for script in SCRIPTS:
            try:
                client.script_load(script.source)
            except redis.ResponseError as exc:
                raise pytest.UsageError(
                    f"mutant {mutant_id} is invalid: script {script.name} does not compile ({exc})"
                ) from None


def pytest_report_header(config: pytest.Config) -> str | None:
    applied = config.stash.get(_APPLIED, None)
    return None if applied is None else f"mutant applied: {applied}"
