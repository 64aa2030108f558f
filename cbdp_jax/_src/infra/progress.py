"""A count and an ETA on one terminal line, for loops that run longer than a few seconds.

:class:`Progress` is a callback ``(done, total)`` a library loop calls after each unit of work (a case,
a chunk of training runs, a block of optimiser steps). On a terminal it rewrites one line of standard
error, at most 80 columns (fewer on a narrower terminal)::

    audit --suite  3/8 cases  38%  1m12s elapsed, ETA 1m58s

and erases it when the work ends, so the output that follows starts on a clean line. When standard
error is not a terminal (piped, redirected, a batch job's or a CI log) it writes a plain line now and
then instead, as tqdm does in logs: no carriage returns, at most one line every
:data:`LOG_SECONDS` (10 s), the first once the work has run that long (so that a short command and a
test runner's captured output stay silent), each with the count, the rate and the ETA::

    cbdp demo  3/12 estimates  25%  31s elapsed, 0.097 estimates/s, ETA 1m33s
 The ETA is the time left at the rate measured since the first
report of a finished unit (so that start-up and compilation, paid before it, do not inflate it), or,
until a second report, the elapsed time scaled by the share left (``elapsed * (total - done) /
done``); it is shown once one unit is done.

Callbacks may come from any thread (a JAX host callback runs in a runtime thread): a lock keeps the
line whole, and redraws are at most five a second. While a bar is open on a terminal a daemon thread
redraws it every second, so the elapsed time moves even while one long unit runs. Other output to the
same terminal goes through :meth:`Progress.say` (or follows :meth:`Progress.clear`), which erases the
line first; the next redraw puts it back under the new text.
"""

from __future__ import annotations

import math
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TextIO

MAX_COLUMNS = 80
LOG_SECONDS = 10.0  # not a terminal: seconds between plain lines (and before the first)
_REDRAW_SECONDS = 0.2
_TICK_SECONDS = 1.0
DELAY_SECONDS = 1.0  # a command done sooner never shows a bar
_ACTIVE: weakref.WeakSet[Progress] = weakref.WeakSet()


def duration(seconds: float) -> str:
    """``seconds`` as ``'42s'``, ``'3m05s'`` or ``'2h07m'``."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def line(
    label: str,
    done: int,
    total: int | None,
    elapsed: float,
    unit: str = "",
    eta: float | None = None,
) -> str:
    """The progress line: label, count, percentage, elapsed time and ETA (no width limit applied).

    ``eta``: seconds left, if known better than ``elapsed * (total - done) / done``.
    """
    noun = f" {unit}" if unit else ""
    if not total:
        return f"{label}  {done}{noun}  {duration(elapsed)} elapsed"
    done = min(done, total)
    text = f"{label}  {done}/{total}{noun}  {100 * done // total}%  {duration(elapsed)} elapsed"
    if 0 < done < total:
        text += f", ETA {duration(elapsed * (total - done) / done if eta is None else eta)}"
    return text


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False


class Progress:
    """One rewritten line on a terminal's standard error; silent when it is not a terminal.

    Use as ``with Progress("audit --suite", total=8, unit="cases") as bar: ... bar.advance()``, or pass
    the instance as a ``(done, total)`` callback. Instances hash by identity, so one can be a static
    argument of a compiled program (a host callback).

    Args:
      label: What is being counted, first on the line.
      total: The number of units (None: unknown; then no percentage or ETA).
      unit: The units' name after the count (``'cases'``, ``'runs'``).
      stream: Where the line goes (default: standard error at the first draw).
      enabled: Draw even when ``stream`` is not a terminal (True) or never (False); default: only on a
        terminal.
      delay: Seconds before the first draw (work done sooner leaves the screen untouched).
      eta: Seconds left, where the caller knows better than the rate so far (a cost table); None
        from it falls back to the rate.
      clock: Seconds from a monotonic clock (a test passes a fake one).

    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        delay: float = DELAY_SECONDS,
        eta: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self._stream = stream
        self._enabled = enabled
        self.delay = delay
        self._eta = eta
        self._clock = clock
        self._start = clock()
        self._drawn = 0  # characters on the line now
        self._last = -float("inf")
        self._lock = threading.RLock()
        self._closed = False
        self._first: tuple[float, int] | None = None  # (time, count) of the first unit reported
        self._reported_eta: float | None = None  # the library's own ETA, when its report has one
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self._stream is None else self._stream

    @property
    def shown(self) -> bool:
        """Whether this bar rewrites a line (a terminal, or ``enabled=True``)."""
        return _is_terminal(self.stream) if self._enabled is None else self._enabled

    @property
    def logged(self) -> bool:
        """Whether this bar writes plain lines now and then instead (not a terminal, not disabled)."""
        return self._enabled is None and not self.shown

    def __call__(self, done: Any, total: int | None = None) -> None:
        """Records that ``done`` units of ``total`` (default: the total given before) are finished.

        ``done`` may also be a library's progress report: an object with ``done`` and ``total`` (and
        optionally ``eta`` in seconds, used when finite), or with ``step`` and ``steps``. A count
        lower than the last one starts a new run of the same work (the ETA's rate restarts).
        """
        reported_eta = None
        if total is None and not isinstance(done, (int, float)) and _fields(done) is not None:
            done, total, reported_eta = _fields(done)
        with self._lock:
            if int(done) < self.done:
                self._first = None
            self.done = int(done)
            if total is not None:
                self.total = int(total)
            self._reported_eta = reported_eta
            self._update()

    def advance(self, n: int = 1) -> None:
        """Records ``n`` more finished units."""
        with self._lock:
            self.done += n
            self._update()

    def _update(self) -> None:
        if self._first is None and self.done > 0:
            self._first = (self._clock(), self.done)
        self._draw(force=self.total is not None and self.done >= self.total)

    def eta(self) -> float | None:
        """Seconds left at the rate since the first report (None before a second report)."""
        if self._reported_eta is not None:
            return self._reported_eta
        if self._eta is not None and self.done > 0:
            told = self._eta()
            if told is not None:
                return told
        if self._first is None or not self.total or self.done <= self._first[1]:
            return None
        t1, n1 = self._first
        rate = (self.done - n1) / max(self._clock() - t1, 1e-9)
        return (self.total - self.done) / rate

    def text(self, width: int | None = None) -> str:
        """The line as drawn now, cut to ``width`` columns (default: the terminal's, at most 80)."""
        if width is None:
            width = min(shutil.get_terminal_size((MAX_COLUMNS, 24)).columns, MAX_COLUMNS)
        elapsed = self._clock() - self._start
        full = line(self.label, self.done, self.total, elapsed, self.unit, self.eta())
        room = max(width - 1, 10)  # the cursor's column: a full-width line would wrap on some terms
        return full if len(full) <= room else full[: room - 3] + "..."

    def _draw(self, force: bool = False) -> None:
        if self._closed:
            return
        if self.logged:
            self._log()
            return
        if not self.shown:
            return
        now = self._clock()
        if now - self._start < self.delay or (not force and now - self._last < _REDRAW_SECONDS):
            return
        self._last = now
        text = self.text()
        _ACTIVE.add(self)
        self._write("\r" + text + " " * max(self._drawn - len(text), 0))
        self._drawn = len(text)

    def _log(self) -> None:
        """Not a terminal: a plain line when LOG_SECONDS have passed since the start or the last one."""
        now = self._clock()
        if now - max(self._start, self._last) < LOG_SECONDS:
            return
        self._last = now
        elapsed = now - self._start
        full = line(self.label, self.done, self.total, elapsed, self.unit, self.eta())
        if self.done > 0 and elapsed > 0:
            noun = self.unit or "units"
            full = full.replace(" elapsed", f" elapsed, {self.done / elapsed:.3g} {noun}/s", 1)
        self._write(full + "\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is never worth an error
            self._closed = True

    def clear(self) -> None:
        """Erases the line (the next output starts at its first column); the bar stays usable."""
        if self._drawn:
            self._write("\r" + " " * self._drawn + "\r")
            self._drawn = 0

    def say(self, text: str, stream: TextIO | None = None) -> None:
        """Prints ``text`` (a line, to ``stream``, default standard output) above the bar."""
        with self._lock:
            self.clear()
            print(text, file=sys.stdout if stream is None else stream, flush=True)
            self._draw(force=True)

    def close(self) -> None:
        """Erases the line and stops drawing."""
        self._stop.set()
        with self._lock:
            self.clear()
            self._closed = True
            _ACTIVE.discard(self)

    def _tick(self) -> None:
        while not self._stop.wait(_TICK_SECONDS):
            with self._lock:
                self._draw(force=True)

    def __enter__(self) -> Progress:
        self._draw(force=True)
        if (self.shown or self.logged) and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="cbdp-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fields(report: Any) -> tuple[int, int, float | None] | None:
    """``(done, total, eta or None)`` from a library's progress report, or None if it is not one."""
    for done, total in (("done", "total"), ("step", "steps")):
        if hasattr(report, done) and hasattr(report, total):
            eta = getattr(report, "eta", None)
            eta = float(eta) if eta is not None and math.isfinite(float(eta)) else None
            return int(getattr(report, done)), int(getattr(report, total)), eta
    return None


def clear_all() -> None:
    """Erases every progress line on screen (before a message that must start on a clean line).

    Takes no lock: it is called when the process is being stopped, possibly from another thread
    while a callback holds one.
    """
    for bar in list(_ACTIVE):
        bar.clear()


def for_terminal(label: str, total: int | None = None, *, unit: str = "") -> Progress | None:
    """A :class:`Progress` when standard error is a terminal, else None (for ``progress=`` hooks)."""
    bar = Progress(label, total, unit=unit)
    return bar if bar.shown else None


__all__ = [
    "LOG_SECONDS",
    "MAX_COLUMNS",
    "Progress",
    "clear_all",
    "duration",
    "for_terminal",
    "line",
]
