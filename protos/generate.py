"""Regenerate the Python stubs for protos/ into the peerd package.

The .proto files live under protos/ in the same folder tree as the Python
package they generate (protos/peerd/proto/v1 -> peerd/proto/v1), so the
generated imports are already correct package imports and nothing is rewritten.

    python protos/generate.py            # write peerd/proto/v1/*_pb2*.py
    python protos/generate.py --out DIR  # write under DIR instead (CI staleness check)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

PROTOS = Path(__file__).resolve().parent
REPO = PROTOS.parent


def generate(out: Path) -> list[Path]:
    sources = sorted(PROTOS.rglob("*.proto"))
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p.relative_to(PROTOS)) for p in sources),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO, help="root to write peerd/proto/... under")
    opts = parser.parse_args()
    sources = generate(opts.out)
    print(f"generated stubs for {len(sources)} proto files under {opts.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
