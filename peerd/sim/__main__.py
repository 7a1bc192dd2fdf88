import os
import sys

# The batched products here are many small matrices: BLAS threads only fight
# each other (and the other jobs on the machine). Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from peerd.sim.cli import main  # noqa: E402

sys.exit(main())
