"""Process helpers shared by the tests that kill real actor processes."""

from __future__ import annotations

import os
import signal
import time


def kill_and_wait(pid: int) -> None:
    """SIGKILL `pid` and wait until it is gone."""
    os.kill(pid, signal.SIGKILL)
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def processes_with_env(name: str, value: str) -> dict[int, str]:
    """pid -> command line of every process of this user whose environment has `name=value`:
    what a process started, and what those started in turn, inherits (orphans and other
    sessions included)."""
    wanted, found = f"{name}={value}".encode(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def processes_in_session(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session `sid` (zombies left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            # after the command's closing parenthesis: state, ppid, pgrp, session, ...
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) != sid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError):
            continue
    return found
