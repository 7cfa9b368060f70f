"""The in-process floors' driver keeps a replay pool of what committed, and lets
it go once a round's floors are done, so the phases after them (the sustained
one included) run without the bench's own objects in the server's process."""

from __future__ import annotations

import pytest

from service import config as cfg
from service.bootstrap import open_backend
from toolkit.bench.driver import BenchError
from toolkit.bench.floors import StorageDriver, ensure_population
from toolkit.bench.workloads import Population


async def test_the_replay_pool_is_let_go_and_refilled() -> None:
    backend = await open_backend(cfg.load({}, {"MC_BACKEND": "memory"}))
    try:
        population = Population("pool")
        await ensure_population(backend, population)
        driver = StorageDriver(backend, population, 100, 1)
        for _ in range(20):
            await driver.fresh()
        assert len(driver.committed) == 20
        pool = driver.committed
        await driver.replay()  # answered from a committed key
        driver.forget()
        assert driver.committed == [] and driver.committed is not pool
        with pytest.raises(BenchError, match="needs committed keys"):
            await driver.replay()
        await driver.fresh()  # the next round's floor refills it
        assert len(driver.committed) == 1
    finally:
        await backend.close()
