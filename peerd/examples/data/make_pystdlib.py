#!/usr/bin/env python
"""Rebuild pystdlib.txt.xz, the text of the character-level LM example.

Concatenates a fixed list of modules from the running interpreter's standard
library (the committed file was built with CPython 3.11.7), each under a
`# file: NAME.py` line, keeping only lines of printable ASCII (charlm.VOCAB:
newline and 0x20-0x7e; a tab becomes 4 spaces), and writes it xz-compressed:

    python peerd/examples/data/make_pystdlib.py   # writes next to this script

Another Python version gives a slightly different text; the committed file is
the one the example job and its tests use. Not installed with the package.
"""

from __future__ import annotations

import lzma
import sysconfig
from pathlib import Path

# Alphabetical; the example holds out the end of the text (the last modules)
# as its validation split.
MODULES = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "difflib", "enum", "fnmatch",
    "functools", "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq",
    "hmac", "json/__init__", "json/decoder", "json/encoder", "linecache",
    "numbers", "operator", "pathlib", "pprint", "queue", "random", "secrets",
    "selectors", "shlex", "shutil", "string", "tempfile", "textwrap", "timeit",
    "tokenize", "traceback", "types", "warnings", "weakref",
)


def printable(line: str) -> bool:
    return all(" " <= c <= "~" for c in line)


def module_text(lib: Path, name: str) -> str:
    source = (lib / f"{name}.py").read_text(encoding="utf-8").expandtabs(4)
    kept = [line for line in source.splitlines() if printable(line)]
    return f"# file: {name}.py\n" + "\n".join(kept) + "\n\n"


def main() -> None:
    lib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(module_text(lib, name) for name in MODULES)
    out = Path(__file__).with_name("pystdlib.txt.xz")
    out.write_bytes(lzma.compress(text.encode("ascii"), preset=9 | lzma.PRESET_EXTREME))
    print(f"{out}: {len(text):,} characters, {out.stat().st_size:,} bytes compressed")


if __name__ == "__main__":
    main()
