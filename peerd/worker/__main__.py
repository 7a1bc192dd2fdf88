import sys

from peerd.worker.main import main

sys.exit(main())
