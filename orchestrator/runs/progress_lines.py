"""Progress for people and for machines: a tqdm bar on a terminal; elsewhere (a log file, a pipe,
a Ray Job's log) one plain line at every tenth of the work or every 30 seconds, whichever comes
first, and a last line at the end: a few lines per phase instead of a bar's hundreds of
carriage-return updates.

    bar = progress_bar(total=2000, unit="ep", desc="curefuzz CartPole-v1", enabled=not quiet)
    bar.set_postfix(failures=12); bar.update(64); ...; bar.close()
"""

from __future__ import annotations

import sys
import time


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class LineProgress:
    """The part of tqdm's interface the campaign uses (``n``, ``update``, ``set_postfix``,
    ``close``), written as plain lines: ``desc: done/total unit (pct%), key=value, elapsed``."""

    def __init__(self, total: float | None, *, initial: float = 0, unit: str = "it", desc: str = "", file=None,
                 fraction: float = 0.1, seconds: float = 30.0, clock=time.monotonic):
        self.total, self.n, self.unit, self.desc = total, initial, unit, desc
        self.file = file if file is not None else sys.stderr
        self.fraction, self.seconds, self.clock = fraction, seconds, clock
        self.postfix: dict = {}
        self.t0 = self.last_t = clock()
        self.last_n = initial
        self.closed = False
        self.lines = 0

    def _step(self) -> float:
        return self.total * self.fraction if self.total else float("inf")

    def update(self, n: float = 1) -> None:
        self.n += n
        now = self.clock()
        if self.n - self.last_n >= self._step() or (now - self.last_t >= self.seconds and self.n != self.last_n):
            self._write(now)

    def set_postfix(self, **kw) -> None:
        self.postfix = kw

    def close(self) -> None:
        if not self.closed and (self.n != self.last_n or self.lines == 0):
            self._write(self.clock())
        self.closed = True

    def _write(self, now: float) -> None:
        done = f"{_num(self.n)}/{_num(self.total)} {self.unit}" if self.total else f"{_num(self.n)} {self.unit}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        post = "".join(f", {k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {done}{pct}{post}, {now - self.t0:.0f} s", file=self.file, flush=True)
        self.last_n, self.last_t = self.n, now
        self.lines += 1


class _Off:
    n = 0

    def update(self, n=1) -> None:
        self.n += n

    def set_postfix(self, **kw) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total, *, initial=0, unit="it", desc="", enabled: bool = True, file=None):
    """tqdm on a terminal, :class:`LineProgress` on anything else, nothing when not ``enabled``."""
    file = file if file is not None else sys.stderr
    if not enabled:
        off = _Off()
        off.n = initial
        return off
    if is_terminal(file):
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, unit=unit, desc=desc, file=file)
    return LineProgress(total, initial=initial, unit=unit, desc=desc, file=file)


def _num(x) -> str:
    return f"{x:.0f}" if isinstance(x, float) else str(x)
