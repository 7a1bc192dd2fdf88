import sys

from peerd.lifeline import die_with_parent

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

    sys.exit(main(argv))

from peerd.worker.main import main

sys.exit(main())
