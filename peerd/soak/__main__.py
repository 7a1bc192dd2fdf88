import sys

from peerd.soak.cli import main

sys.exit(main())
