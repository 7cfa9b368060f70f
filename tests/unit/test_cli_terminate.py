"""A campaign tool stopped with SIGTERM (``timeout``, ``kill``, a CI runner) cleans up as
on Ctrl-C: its ``finally`` blocks run, so the servers, relays and devices it started
stop with it. Before, SIGTERM ended the process at once: an aborted
``nemesis --system e2e`` left its two relay processes running for almost an hour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = """
import asyncio, pathlib, sys, types
from service import cli

async def body() -> None:
    try:
        print("ready", flush=True)
        await asyncio.sleep(60)
    finally:
        pathlib.Path(sys.argv[1]).write_text("cleaned up")

tool = types.ModuleType("fake_campaign_tool")
tool.main = lambda argv: asyncio.run(body()) or 0
sys.modules["fake_campaign_tool"] = tool
cli.DELEGATED["nemesis"] = ("fake_campaign_tool", "a campaign that starts processes")
sys.exit(cli.main(["nemesis"]))
"""


def test_a_delegated_tool_runs_its_cleanup_on_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", TOOL, str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert marker.read_text() == "cleaned up", err
    assert proc.returncode != 0  # stopped, not a success
