"""The ``cbdp`` command line: exact values, estimates, the demo, paper reproductions, reruns.

Every bad input exits with status 2 and one line ``error: <parameter>=<value> is invalid: <range>`` on
stderr, without a traceback; Ctrl-C ends any command with one line ``interrupted`` and status 130
(within two seconds from the ``cbdp`` executable: :mod:`cbdp_jax._src.infra.interrupt`). Each command's code is in its own module of this package (``exact``,
``calibrate``, ``estimate``, ``audit``, ``audit_training``, ``rerun``, ``demo``, ``sweep``,
``reproduce``); what several share is in ``_common``. This module holds the app and the entry points.
"""

from __future__ import annotations

import inspect
import os
import sys

# `cbdp rerun` promises bit-identical numbers on the same device: ask XLA for deterministic GPU kernels
# before JAX initialises its backend (importing the package does not initialise it).
from cbdp_jax._src.infra.determinism import request_deterministic_gpu_ops

request_deterministic_gpu_ops()

import typer  # noqa: E402

from cbdp_jax._src.infra.validation import InvalidParameterError  # noqa: E402
from cbdp_jax.cli.audit import audit_cmd  # noqa: E402
from cbdp_jax.cli.audit_training import audit_training_cmd  # noqa: E402
from cbdp_jax.cli.calibrate import calibrate_cmd  # noqa: E402
from cbdp_jax.cli.demo import demo_cmd  # noqa: E402
from cbdp_jax.cli.estimate import estimate_cmd  # noqa: E402
from cbdp_jax.cli.exact import exact_cmd  # noqa: E402
from cbdp_jax.cli.reproduce import _experiment_lines, reproduce_cmd  # noqa: E402
from cbdp_jax.cli.rerun import rerun_cmd  # noqa: E402
from cbdp_jax.cli.sweep import sweep_cmd  # noqa: E402

__all__ = ["QUICK_EXIT_COMMANDS", "app", "console_main", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Capacity bounded differential privacy: exact, analytic and learned restricted divergences.",
)

# In this order in `cbdp --help`.
# The exit status of a command that failed (an exception no check caught, XLA out of memory): never a
# verdict, so a script cannot read a crash as an audit's certified violation (1) or defect (3).
FAILED = 4

COMMANDS = {
    "exact": exact_cmd,
    "calibrate": calibrate_cmd,
    "estimate": estimate_cmd,
    "audit": audit_cmd,
    "audit-training": audit_training_cmd,
    "rerun": rerun_cmd,
    "demo": demo_cmd,
    "sweep": sweep_cmd,
    "reproduce": reproduce_cmd,
}


def _reflowed(doc: str) -> str:
    """A docstring as help text: each paragraph on one line, so the terminal wraps it.

    Typer's rich help keeps single newlines, which broke lines mid-sentence at any width but the
    source's.
    """
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _help(callback) -> str:
    """A command's help: its docstring reflowed; ``reproduce``'s also lists the experiments."""
    text = _reflowed(callback.__doc__)
    if callback is reproduce_cmd:
        # rich help keeps the blank lines between paragraphs: one experiment per paragraph
        text += "\n\nExperiments:\n\n" + "\n\n".join(_experiment_lines())
    return text


for _name, _callback in COMMANDS.items():
    app.command(_name, help=_help(_callback))(_callback)


@app.callback()
def _options(
    debug: bool = typer.Option(
        False, "--debug", help="print the full traceback of an error (also: CBDP_DEBUG=1)"
    ),
) -> None:
    """Options of every command (given before the command's name: cbdp --debug audit ...)."""
    from cbdp_jax._src.infra.user_code import set_debug

    set_debug(debug)


def main() -> None:
    """Console entry point: runs the app, turning bad input into a one-line error and exit 2.

    Ctrl-C (``KeyboardInterrupt``, which typer turns into ``Exit(130)``, raised or returned) ends with
    one line ``interrupted`` on stderr and status 130. XLA running out of memory ends with one line and
    status 4 (``FAILED``: never a verdict; an audit's 1 means a certified violation, its 3 a defect;
    sizes the command line can check beforehand are refused with status 2), and so does any other
    exception: its type, message and the file and line that raised it (the user's own code
    where it was there). ``cbdp --debug`` or ``CBDP_DEBUG=1`` prints the full traceback as well.
    """
    from cbdp_jax._src.infra.user_code import (
        debug_enabled,
        internal_error_text,
        print_traceback,
        set_debug,
    )

    set_debug(False)
    try:
        code = app(standalone_mode=False)
    except InvalidParameterError as exc:
        if debug_enabled():  # the traceback of what raised it (a user's code: its own frames)
            print_traceback(exc)
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            _interrupted()
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except typer.TyperException as exc:  # usage errors: unknown option, bad type
        typer.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code or 2)
    except Exception as exc:
        from cbdp_jax._src.infra.sizes import out_of_memory_text

        line = out_of_memory_text(exc)
        if debug_enabled():
            raise
        # one line, not a traceback: XLA's out-of-memory error, or where the exception was raised
        typer.echo(f"error: {line or internal_error_text(exc)}", err=True)
        sys.exit(FAILED)
    if code == 130:  # no command returns 130: typer's Exit(130) for a KeyboardInterrupt, returned
        _interrupted()
    sys.exit(code if isinstance(code, int) else 0)


def _interrupted() -> None:
    from cbdp_jax._src.infra.interrupt import EXIT_STATUS, announce

    announce()
    sys.exit(EXIT_STATUS)


# Commands after which the ``cbdp`` executable skips interpreter teardown (see console_main): they
# start no other process and no jax.distributed job, and write every file before they return.
QUICK_EXIT_COMMANDS = frozenset({"estimate", "exact", "rerun"})


def console_main() -> None:
    """The ``cbdp`` executable: :func:`main`, then, for ``QUICK_EXIT_COMMANDS``, an immediate exit.

    A process that has run JAX spends about 0.2 s tearing the interpreter down after its work is done
    (XLA's runtime, thread pools, module clean-up): a fifth of a warm ``cbdp estimate``. By then every
    output is written and closed (result files atomically; JAX's compilation cache and the program
    store write as they compile), so those commands flush stdout and stderr and leave with
    ``os._exit`` and main's status. Any other command, an uncaught exception, and in-process callers
    of :func:`main` exit normally.

    Ctrl-C: the watchdog of :mod:`cbdp_jax._src.infra.interrupt` is armed first, so a command stuck in a
    long compiled program still ends within two seconds; an interrupt that unwound normally (every
    ``finally`` has run, files are whole or absent) skips the teardown too, which can otherwise wait
    for a computation still running in XLA's threads.
    """
    from cbdp_jax._src.infra.interrupt import EXIT_STATUS, install

    install()
    if len(sys.argv) < 2 or sys.argv[1] not in QUICK_EXIT_COMMANDS:
        try:
            main()
        except SystemExit as exc:
            if exc.code == EXIT_STATUS:
                _quick_exit(EXIT_STATUS)
            raise
        return
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    _quick_exit(code)


def _quick_exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
