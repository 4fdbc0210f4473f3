"""The local Ray cluster's supervisor: no Ray process outlives the driver that started it.

``ray.init(address="local")`` starts the cluster's processes (GCS, raylet, dashboard, log
monitor) as children of the driver. When the driver is killed (SIGKILL, OOM killer, a closed
terminal), the GCS and the raylet follow it, but the raylet's agents (dashboard agent,
runtime-env agent) keep running and listening for up to a minute while they try to flush logs
to the dead GCS, and workers can linger too.

:func:`supervise` starts this file as a small separate program (standard library only, in its
own session so that a Ctrl-C to the driver's terminal does not reach it); the driver goes on once
it has recorded the cluster's processes. It holds the read end of a pipe whose write end only
the driver holds; every half second it records the processes
descending from the cluster's processes (with their start times, so that a reused PID is never
touched). When the pipe reports end-of-file (the driver is gone, however it died), it stops
(SIGSTOP) the recorded processes and any children they started, looking again until no new one
appears, then kills (SIGKILL) them all and exits: a tree ended while it runs can leave behind a
child started after the last look. It never touches a process it did not see descending from
the cluster.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()  # fields after "(comm)"
    try:
        return int(rest[1]), int(rest[19])  # ppid, starttime
    except (IndexError, ValueError):
        return None


def _descendants(roots: dict[int, int]) -> dict[int, int]:
    """``roots`` (pid -> start time) and every live process descending from one of them."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                table[int(name)] = st
    found = {pid: start for pid, start in roots.items() if table.get(pid, (0, None))[1] == start}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, start) in table.items():
            if ppid in found and pid not in found:
                found[pid] = start
                grew = True
    return found


def _alive(tracked: dict[int, int]) -> dict[int, int]:
    return {pid: start for pid, start in tracked.items() if (_stat(pid) or (0, None))[1] == start}


def _signal(tracked: dict[int, int], sig: int) -> None:
    for pid in _alive(tracked):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def freeze(tracked: dict[int, int]) -> dict[int, int]:
    """Stop (SIGSTOP) every tracked process and every descendant it has, until a look at /proc
    finds no new one: a stopped process cannot start another, and a child started while its
    parent was being stopped is found under that parent (still alive, stopped) at the next look.
    Ending a tree while it is running instead can miss a child started after the last look,
    which its killed parent then leaves behind (seen: two of the dashboard's processes
    outliving their driver)."""
    frozen: dict[int, int] = {}
    while True:
        tracked.update(_descendants(tracked))
        new = {pid: start for pid, start in _alive(tracked).items() if pid not in frozen}
        if not new:
            return frozen
        _signal(new, signal.SIGSTOP)
        frozen.update(new)


def watch(fd: int, roots: list[int], poll_s: float = 0.5) -> None:
    """Track ``roots`` and their descendants until ``fd`` reaches end-of-file; then end them."""
    tracked = {pid: st[1] for pid in roots if (st := _stat(pid)) is not None}
    tracked.update(_descendants(tracked))
    print("watching", flush=True)  # the driver waits for this first look (supervise)
    sys.stdout.close()
    while True:
        ready, _, _ = select.select([fd], [], [], poll_s)
        if ready and not os.read(fd, 4096):
            break  # the driver is gone (or shut Ray down and exited)
        tracked.update(_descendants(tracked))
    frozen = freeze(tracked)
    _signal(frozen, signal.SIGKILL)  # the driver is gone: nothing is left for them to finish


def supervise(roots: list[int], startup_s: float = 30.0) -> subprocess.Popen | None:
    """Start the supervisor of the cluster processes ``roots`` (PIDs) for this driver, and wait
    (at most ``startup_s``) until it has recorded them and their descendants; returns its process
    (waited for by a daemon thread; the pipe's write end stays open until the driver exits)."""
    if not sys.platform.startswith("linux") or not roots:
        return None  # /proc is Linux's; elsewhere Ray's own fate-sharing is all there is
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(read_end), *map(str, roots)],
                                pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    os.close(read_end)
    # wait for the supervisor's first look at the cluster's processes: a driver killed before it
    # (a slow start on a loaded machine) left the raylet's agents untracked, and once the raylet
    # died they were no one's descendants (seen: the dashboard and runtime-env agents outliving it)
    ready, _, _ = select.select([proc.stdout], [], [], startup_s)
    if ready:
        proc.stdout.readline()
    proc.stdout.close()
    os.set_inheritable(write_end, False)
    proc._deltarl_pipe = write_end  # held open for the life of this process: its end-of-file is the signal
    # a daemon thread waits for the supervisor: it holds the process object (no module does) and
    # reaps it should it end first; the pipe's write end, a bare descriptor, closes with this process
    threading.Thread(target=proc.wait, name="deltarl-cluster-supervisor", daemon=True).start()
    return proc


if __name__ == "__main__":  # python watchdog.py FD PID...
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), [int(p) for p in sys.argv[2:]])
