"""Progress lines (issue 42): a count and an ETA on a terminal, one line of at most 80 columns,
a plain line every 10 s when not a terminal (issue 49); the interrupt machinery's partial-write
clean-up."""

import io
import os
import threading
import time

import pytest

from cbdp_jax._src.infra import io as cio
from cbdp_jax._src.infra.progress import Progress, duration, line


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_has_count_percentage_elapsed_and_eta():
    assert line("cbdp audit --suite", 0, 17, 3.0, "cases") == (
        "cbdp audit --suite  0/17 cases  0%  3s elapsed"
    )
    # ETA from the elapsed time scaled by the share left: 4 of 16 in 60 s -> 180 s left
    assert line("x", 4, 16, 60.0) == "x  4/16  25%  1m00s elapsed, ETA 3m00s"
    assert line("x", 16, 16, 61.0).endswith("100%  1m01s elapsed")  # no ETA when done
    assert line("x", 3, None, 7200.0, "runs") == "x  3 runs  2h00m elapsed"  # no total: no ETA
    assert duration(59.4) == "59s" and duration(3599) == "59m59s" and duration(-1) == "0s"


def test_a_terminal_gets_one_rewritten_line_of_at_most_80_columns():
    out = _Terminal()
    bar = Progress("a label long enough to need cutting " * 4, total=10, unit="cases",
                   stream=out, delay=0.0)  # fmt: skip
    with bar:
        for _ in range(10):
            bar.advance()
    text = out.getvalue()
    assert "\n" not in text  # one line, rewritten with carriage returns
    drawn = [seg for seg in text.split("\r") if seg.strip()]
    assert drawn and all(len(seg) <= 79 for seg in drawn)
    assert drawn[-1].rstrip().endswith("...")  # cut to fit, never wrapped
    assert text.endswith("\r")  # erased at the end: what follows starts on a clean line
    assert text.rsplit("\r", 2)[-2].strip() == ""


def test_a_short_run_writes_nothing_when_the_stream_is_not_a_terminal():
    out = io.StringIO()  # a pipe or a file: isatty() is False
    with Progress("x", total=3, stream=out, delay=0.0) as bar:
        for i in range(3):
            bar(i + 1, 3)
    assert out.getvalue() == ""  # done within LOG_SECONDS: a short command's log stays clean
    assert bar.done == 3  # it still counts (a caller may read it)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_redirected_log_gets_a_plain_line_every_ten_seconds_with_count_rate_and_eta():
    out, clock = io.StringIO(), _Clock()  # a file: isatty() is False
    bar = Progress("cbdp demo", total=12, unit="estimates", stream=out, clock=clock)
    bar._ticker = (
        object()
    )  # no redraw thread: only the fake clock decides (the ticker redraws alike)
    with bar:
        for _ in range(12):
            clock.now += 4.0  # one estimate every 4 s: lines at 12 s, 24 s, 36 s, 48 s at most
            bar.advance()
    text = out.getvalue()
    assert "\r" not in text  # plain lines, no carriage returns
    lines = text.splitlines()
    assert lines[0] == "cbdp demo  3/12 estimates  25%  12s elapsed, 0.25 estimates/s, ETA 36s"
    # at most one line per 10 s of the fake clock: 48 s of work, so 4 lines (12, 24, 36, 48 s)
    assert len(lines) == 4 and lines[-1].startswith("cbdp demo  12/12 estimates  100%  48s")
    # Negative control: the same run on a terminal rewrites one line instead
    term = _Terminal()
    with Progress("cbdp demo", total=2, stream=term, delay=0.0, clock=clock) as tbar:
        tbar.advance()
    assert "\r" in term.getvalue() and "\n" not in term.getvalue()


def test_a_disabled_bar_writes_nothing_even_in_a_log():
    out, clock = io.StringIO(), _Clock()
    with Progress("x", total=2, stream=out, enabled=False, clock=clock) as bar:
        clock.now += 60.0
        bar.advance()
    assert out.getvalue() == ""


def test_the_eta_uses_the_rate_after_the_first_report():
    # Start-up (compilation) before the first unit must not inflate the ETA: 2 s before the first
    # report, then 10 units in 1 s -> 90 units left take about 9 s, not 99.
    bar = Progress("x", total=100, stream=io.StringIO())
    bar._start -= 2.0
    bar(1)
    bar._first = (bar._first[0] - 1.0, 1)
    bar(11)
    assert bar.eta() == pytest.approx(89 / 10, rel=0.05)
    told = Progress("x", total=100, stream=io.StringIO(), eta=lambda: 42.0)
    told(1)
    assert told.eta() == 42.0  # a caller's better estimate (reproduce's cost table) wins


def test_say_prints_above_the_bar_and_callbacks_from_threads_keep_it_whole():
    out, err = io.StringIO(), _Terminal()
    with Progress("x", total=400, stream=err, delay=0.0) as bar:
        threads = [threading.Thread(target=lambda: [bar.advance() for _ in range(100)])
                   for _ in range(4)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        bar.say("a row", stream=out)
    assert bar.done == 400 and out.getvalue() == "a row\n"
    for seg in err.getvalue().split("\r"):
        assert seg.strip() == "" or seg.startswith("x  ")  # no interleaved half lines


def test_remove_partial_writes_deletes_temporaries_and_blocks_new_writes(tmp_path, monkeypatch):
    # A write in progress (its temporary file exists) when the process is stopped from another
    # thread: the temporary goes, the target never appears, and no later write starts.
    lock = cio.threading.Lock()
    monkeypatch.setattr(cio, "_PARTIAL_LOCK", lock)
    monkeypatch.setattr(cio, "_PARTIAL", set())
    started, release = threading.Event(), threading.Event()
    real_fdopen = os.fdopen

    def slow_fdopen(fd, mode):
        started.set()
        release.wait(5)
        return real_fdopen(fd, mode)

    monkeypatch.setattr(cio.os, "fdopen", slow_fdopen)
    errors = []

    def writer():
        try:
            cio.atomic_write_bytes(tmp_path / "result.json", b"{}")
        except OSError as exc:
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    assert started.wait(5)
    assert len(list(tmp_path.glob(".result.json.*.tmp"))) == 1
    assert cio.remove_partial_writes(timeout=1.0)
    assert list(tmp_path.iterdir()) == []  # the temporary is gone
    release.set()
    t.join(5)
    assert not (tmp_path / "result.json").exists() and errors  # its rename found nothing
    blocked = threading.Thread(target=lambda: cio.atomic_write_bytes(tmp_path / "b", b"x"))
    blocked.daemon = True
    blocked.start()
    time.sleep(0.3)
    assert blocked.is_alive() and not (tmp_path / "b").exists()  # no new write starts


def test_library_reports_are_understood():
    # The shapes the libraries' hooks report in: sharded runs' (done, total, seconds, eta) and the
    # estimator's training segments (block, blocks, step, steps).
    from typing import NamedTuple

    class Runs(NamedTuple):
        done: int
        total: int
        seconds: float
        eta: float

    class Steps(NamedTuple):
        block: int
        blocks: int
        step: int
        steps: int

    bar = Progress("x", stream=io.StringIO())
    bar(Runs(4096, 20000, 3.0, float("inf")))
    assert (bar.done, bar.total, bar.eta()) == (4096, 20000, None)  # inf: not known yet
    bar(Runs(8192, 20000, 4.0, 7.5))
    assert bar.eta() == 7.5  # the library's own ETA
    bar(Steps(3, 20, 300, 2000))
    assert (bar.done, bar.total) == (300, 2000) and bar._first[1] == 300  # a new run: rate restarts


def test_audit_reports_its_certification_samples_to_a_progress_hook():
    # audit() takes progress= like the training audit: the certification samples of D and D' as one
    # count (0, n, 2n), which the command line's bar takes (cli._common.progress_hook finds it).
    import jax
    import jax.numpy as jnp

    from cbdp_jax import audit as au
    from cbdp_jax.cli._common import progress_hook

    def gaussian(key, dataset, n):  # traces under jit with a typed key
        return jax.random.normal(key, (n,)) + jnp.sum(dataset)

    reports = []
    config = au.AuditConfig(samples=2000, classes=("halfspace",), eps_grid=(1.0,))
    result = au.audit(
        jax.random.key(0), gaussian, "approx:1:1e-5", pair=([0.0], [1.0]), config=config,
        progress=reports.append,
    )  # fmt: skip
    assert [(r.done, r.total) for r in reports] == [(0, 4000), (2000, 4000), (4000, 4000)]
    assert reports[-1].eta == 0.0 and result.samples == 2000
    assert progress_hook(au.audit, object()) != {}  # the bar is passed now
    assert (
        progress_hook(lambda key: None, object()) == {}
    )  # negative control: a function without it
