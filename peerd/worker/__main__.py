import atexit
import logging
import os
import sys
import threading

from peerd.control.lifeline import die_with_parent


def exit_now(code: int) -> None:
    """Exit without the interpreter's teardown, which takes seconds with torch
    loaded and keeps the device from a machine's owner (docs/operations.md,
    "Shared machines"). The state is on disk by now (checkpoints and models are
    written atomically); threads and exit handlers (a script's too) run first."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))


die_with_parent()  # first: nothing below may outlive the daemon

if sys.argv[1:] == ["--standby"]:
    # Started ahead of a join by the daemon (peerd.daemon.standby): import now,
    # then take the real command line from stdin.
    from peerd.worker.standby import wait_for_launch

    argv = wait_for_launch()
    if argv is None:
        sys.exit(0)
    sys.argv[1:] = argv
    from peerd.worker.main import main

    exit_now(main(argv))

from peerd.worker.main import main

exit_now(main())
