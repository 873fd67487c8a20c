# SPDX-License-Identifier: BSD-3-Clause
"""bench_cleanup.py — how the benchmark drivers (bench_cosched.py, bench_containers.py, beside this
file) stop: run_with_cleanup() runs a bench's run() and then, whatever happened, its cleanup().

Contract: SIGTERM stops the run with exit status 143, ^C with "<prog>: interrupted" on stderr and
exit status 130, a normal end returns 0; from the first signal on, further SIGTERMs and ^Cs are
ignored, so they cannot cut the clean-up short (timeout(1) signals its child and then its whole
process group, so a driver gets SIGTERM twice). Exceptions other than ^C propagate after the
clean-up. A bench that could not be made (make() raised) has nothing to clean up.
"""
from __future__ import annotations

import signal
import sys
from typing import Callable, Protocol


class Bench(Protocol):
    def run(self) -> None: ...
    def cleanup(self) -> None: ...


def ignore_stop_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_on_signal(*_) -> None:
    """SIGTERM: stop the run through the clean-up, ignoring any further SIGTERM or ^C from here on."""
    ignore_stop_signals()
    sys.exit(143)


def run_with_cleanup(prog: str, make: Callable[[], Bench], restore_sigint: bool = False) -> int:
    """make() the bench and run() it; always cleanup(). restore_sigint: take ^C again in a driver
    started in the background by a shell, which starts it with SIGINT ignored."""
    signal.signal(signal.SIGTERM, stop_on_signal)
    if restore_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    bench = None
    try:
        bench = make()
        bench.run()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        ignore_stop_signals()
        if bench is not None:
            bench.cleanup()
    return 0
