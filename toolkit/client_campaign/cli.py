"""``message-committer client-campaign``: seeded client crashes at every client
fault point, with server kills mixed in; prints the figures and exits 1 on any
lost, duplicated or phantom message, or a seed that did not settle.

::

    message-committer client-campaign --seeds 500 --clients 3 --parallel 4

Replay a failing seed with ``--first-seed S --seeds 1`` (the same actions in
the same order; the timing between them is the machine's).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from client.faults import ClientPoint
from toolkit.client_campaign.scenario import ABANDONED, Options, SeedResult, run_seed

PROG = "message-committer client-campaign"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--seeds", type=int, default=100, help="how many seeds [100]")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed [0]")
    p.add_argument("--clients", type=int, default=3, help="client runtimes per seed [3]")
    p.add_argument("--steps", type=int, default=40, help="actions per seed [40]")
    p.add_argument("--parallel", type=int, default=4, help="seeds run at once [4]")
    p.add_argument("--settle", type=float, default=60.0, help="seconds a seed may take to settle")
    p.add_argument("--seed-timeout", type=float, default=240.0, help="seconds a seed may run")
    p.add_argument(
        "--processes",
        action="store_true",
        help="the process mode: real device and server processes (--processes --help)",
    )
    p.add_argument(
        "--require-every-point",
        action="store_true",
        help="fail unless every client fault point fired at least once",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--processes" in argv:  # the process mode: real device and server processes
        from toolkit.client_campaign import proc_cli

        return proc_cli.main([a for a in argv if a != "--processes"])
    args = _parser().parse_args(argv)
    if not (1 <= args.clients <= 20 and 1 <= args.parallel <= 32 and args.seeds >= 1):
        print(f"{PROG}: --clients 1-20, --parallel 1-32, --seeds >= 1", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.CRITICAL)
    options = Options(
        clients=args.clients,
        steps=args.steps,
        settle_s=args.settle,
        seed_timeout_s=args.seed_timeout,
    )
    started = time.monotonic()
    results = asyncio.run(_run(args, options))
    return _report_run(results, started, args)


def _report_run(results: list[SeedResult], started: float, args: argparse.Namespace) -> int:
    return report(
        results,
        time.monotonic() - started,
        clients=args.clients,
        require_every_point=args.require_every_point,
    )


def _report_abandoned(results: list[SeedResult], started: float, args: argparse.Namespace) -> None:
    """A hung teardown would also hang the loop's shutdown: report now and exit."""
    code = _report_run(results, started, args)
    print(f"{len(ABANDONED)} seed(s) abandoned with a hung teardown; exiting", flush=True)
    sys.stderr.flush()
    os._exit(code or 1)


BLOCKED_S = 60.0
"""An event loop that has not run a tick for this long is blocked (a coroutine that
never awaits): the threads' stacks are printed once, since no timeout can fire."""


async def _heartbeat(beat: list[float]) -> None:
    while True:
        beat[0] = time.monotonic()
        await asyncio.sleep(1.0)


def _watch_loop(beat: list[float], done: threading.Event) -> None:
    while not done.wait(5.0):
        if time.monotonic() - beat[0] > BLOCKED_S:
            print(f"{PROG}: the event loop has been blocked for {BLOCKED_S:.0f} s", file=sys.stderr)
            faulthandler.dump_traceback(sys.stderr, all_threads=True)
            return


async def _run(args: argparse.Namespace, options: Options) -> list[SeedResult]:
    beat, done = [time.monotonic()], threading.Event()
    heart = asyncio.create_task(_heartbeat(beat))
    watcher = threading.Thread(target=_watch_loop, args=(beat, done), daemon=True)
    watcher.start()
    try:
        return await _seeds(args, options)
    finally:
        done.set()
        heart.cancel()


async def _seeds(args: argparse.Namespace, options: Options) -> list[SeedResult]:
    limit = asyncio.Semaphore(args.parallel)
    with tempfile.TemporaryDirectory(prefix="mc-client-campaign-") as tmp:

        async def one(seed: int) -> SeedResult:
            async with limit:
                result = await run_seed(seed, options, Path(tmp) / f"seed-{seed}")
            if not result.ok:
                print(f"seed {seed}: " + "; ".join(result.problems[:5]), flush=True)
            return result

        started = time.monotonic()
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        results = list(await asyncio.gather(*(one(s) for s in seeds)))
        if ABANDONED:
            _report_abandoned(results, started, args)
        return results


def report(
    results: list[SeedResult], seconds: float, *, clients: int, require_every_point: bool
) -> int:
    """Print the figures; 1 when anything was lost, duplicated, phantom or stuck."""
    crashes: Counter[str] = Counter()
    confirmed: Counter[str] = Counter()
    server_faults: Counter[str] = Counter()
    unexpected: Counter[str] = Counter()
    for r in results:
        unexpected.update(r.unexpected)
        crashes.update(r.crashes)
        confirmed.update(r.confirmed)
        server_faults.update(r.server_faults)

    def total(name: str) -> int:
        return sum(int(getattr(r, name)) for r in results)

    print(f"seeds: {len(results)}  clients per seed: {clients}  in {seconds:.0f} s")
    print(f"sends persisted: {total('sends')}  confirmed: " + _counts(confirmed))
    print("client crashes by point: " + _counts(crashes))
    print(f"server kills: {total('server_kills')}  server faults armed: " + _counts(server_faults))
    print(f"rebuilds: {total('rebuilds')}  local store resets: {total('resets')}")
    stuck = sum(r.stuck for r in results)
    lost, dup, phantom = total("lost"), total("duplicated"), total("phantom")
    print(f"lost: {lost}  duplicated: {dup}  phantom: {phantom}  stuck seeds: {stuck}")
    if unexpected:
        print("unexpected runtime errors: " + _counts(unexpected))
    missing = [p.value for p in ClientPoint if not crashes[p.value]]
    if missing:
        print("client fault points that never fired: " + ", ".join(missing))
    failed = lost or dup or phantom or stuck or unexpected or (require_every_point and missing)
    return 1 if failed else 0


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"
