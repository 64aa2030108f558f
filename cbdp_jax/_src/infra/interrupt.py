"""Ctrl-C ends a command within two seconds: one line ``interrupted``, exit status 130, no partial file.

Python turns SIGINT into ``KeyboardInterrupt`` only when the main thread next runs Python code. While
it waits in one long compiled program (an estimator's training, thousands of DP-SGD runs) that can be
minutes away. :func:`install` therefore has the C-level signal handler also write to a socket
(``signal.set_wakeup_fd``, which does not wait for the main thread), and a daemon thread reading that
socket gives the process :data:`GRACE_SECONDS` to end the ordinary way (the ``KeyboardInterrupt``
unwinds, ``finally`` blocks run, the command line prints ``interrupted`` and exits 130). A process still
running after that is ended from the watchdog thread: the progress line is erased, the temporary files
of any atomic write in progress are deleted and no new write may start
(:func:`cbdp_jax._src.infra.io.remove_partial_writes`), ``interrupted`` is printed and the process exits 130
without running anything else. Every result file the commands write goes through those atomic writes,
so a file is either complete or absent.

A ``KeyboardInterrupt`` that lands in a callback Python cannot raise from (a garbage-collector callback
of JAX's, a ``__del__``) would be printed as "Exception ignored ..." and lost; the armed process passes
it on to the main thread instead (:func:`_unraisable`), silently.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import socket
import sys
import threading
import time

GRACE_SECONDS = 1.0
EXIT_STATUS = 130
MESSAGE = "interrupted"

_ANNOUNCED = threading.Event()
_INSTALLED = threading.Event()


def announce() -> None:
    """Erases any progress line and prints ``interrupted`` on standard error, once per process."""
    if _ANNOUNCED.is_set():
        return
    _ANNOUNCED.set()
    from cbdp_jax._src.infra.progress import clear_all

    try:
        clear_all()
        sys.stderr.write(MESSAGE + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the terminal is gone: the exit status still says it
        pass


def force_exit() -> None:
    """Ends the process now, from any thread: no partial file left, ``interrupted``, status 130."""
    from cbdp_jax._src.infra.io import remove_partial_writes

    remove_partial_writes()
    announce()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(EXIT_STATUS)


def _watch(reader: socket.socket, grace: float) -> None:
    """Waits for SIGINT's byte on ``reader``; then, after ``grace`` seconds, :func:`force_exit`."""
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT in data:
            break
    threading.Event().wait(grace)
    force_exit()


def _interrupt_main_later() -> None:
    time.sleep(0.05)  # after the hook has returned: raised inside it, it would be lost again
    _thread.interrupt_main()


def _unraisable(previous):
    def hook(unraisable) -> None:
        try:
            if isinstance(unraisable.exc_value, KeyboardInterrupt):
                # raised again in the main thread where it can unwind (a raw thread: starting it
                # waits for nothing); if it is lost again, the watchdog still ends the process
                _thread.start_new_thread(_interrupt_main_later, ())
                return
        except KeyboardInterrupt:
            return  # an interrupt inside this hook: the watchdog ends the process
        previous(unraisable)

    return hook


def install(grace: float = GRACE_SECONDS) -> bool:
    """Arms the watchdog (once per process, from the main thread); returns whether it is armed.

    Only the ``cbdp`` executable arms it: a library, a test runner or a notebook keeps Python's own
    handling of Ctrl-C.
    """
    if _INSTALLED.is_set():
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False  # someone else handles SIGINT: leave it to them
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        reader.close()
        writer.close()
        return False
    # Kept open for the life of the process (the wakeup fd must stay valid).
    _SOCKETS.extend((reader, writer))
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    threading.Thread(
        target=_watch, args=(reader, grace), name="cbdp-interrupt", daemon=True
    ).start()
    _INSTALLED.set()
    return True


_SOCKETS: list[socket.socket] = []

__all__ = ["EXIT_STATUS", "GRACE_SECONDS", "MESSAGE", "announce", "force_exit", "install"]
