import sys

from peerd.sim.cli import main

sys.exit(main())
