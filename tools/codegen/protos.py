"""Regenerate lake_core.proto Python modules from the Flight/Flight SQL protos.

Usage: python tools/codegen/protos.py [--check]

Needs grpcio-tools (build time only). The generated modules need just
protobuf and grpcio at runtime. ``--check`` regenerates into a temporary
directory and fails if the committed files differ.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped, unused-ignore]

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "packages" / "lake-core" / "src" / "lake_core" / "proto"
PACKAGE = "lake_core.proto"
PROTOS = ("Flight.proto", "FlightSql.proto")
GENERATED = (
    "Flight_pb2.py",
    "Flight_pb2.pyi",
    "Flight_pb2_grpc.py",
    "FlightSql_pb2.py",
    "FlightSql_pb2.pyi",
)

# protoc emits sibling imports as top-level modules (`import Flight_pb2`),
# which only resolve if the directory is on sys.path; rewrite to the package.
_SIBLING_IMPORT = re.compile(r"^import (Flight(?:Sql)?_pb2) as ", re.MULTILINE)


def _protoc(out_dir: Path) -> None:
    # The well-known types (timestamp/descriptor) ship inside grpc_tools.
    include = Path(protoc.__file__).resolve().parent / "_proto"
    base = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    # Only Flight has a service; FlightSql is messages carried inside Flight.
    if protoc.main([*base, f"--grpc_python_out={out_dir}", "Flight.proto"]) != 0:
        raise SystemExit("protoc failed for Flight.proto")
    if protoc.main([*base, "FlightSql.proto"]) != 0:
        raise SystemExit("protoc failed for FlightSql.proto")


def _postprocess(out_dir: Path) -> None:
    for name in GENERATED:
        path = out_dir / name
        text = _SIBLING_IMPORT.sub(rf"from {PACKAGE} import \1 as ", path.read_text())
        path.write_text(text)


def generate(out_dir: Path) -> None:
    """Run protoc for both protos into ``out_dir`` and fix imports."""
    _protoc(out_dir)
    _postprocess(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        if args.check:
            stale = [
                n
                for n in GENERATED
                if not (PROTO_DIR / n).exists()
                or not filecmp.cmp(out / n, PROTO_DIR / n, shallow=False)
            ]
            if stale:
                print("stale generated files: " + ", ".join(stale), file=sys.stderr)
                return 1
            return 0
        for name in GENERATED:
            shutil.copyfile(out / name, PROTO_DIR / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
