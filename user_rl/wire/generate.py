"""Regenerate `user_rl_pb2.py` from `user_rl.proto` (needs the `dev` extra: grpcio-tools)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

WIRE_DIR = Path(__file__).resolve().parent
PROTO = WIRE_DIR / "user_rl.proto"
GENERATED = WIRE_DIR / "user_rl_pb2.py"


def generate(out_dir: Path) -> Path:
    """Run protoc on the schema into `out_dir` and return the generated module's path."""
    from grpc_tools import protoc

    # Compile from the repository root so the module's import name is stable.
    root = WIRE_DIR.parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(["protoc", f"-I{root}", f"--python_out={tmp}", str(PROTO.relative_to(root))])
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        produced = Path(tmp) / "user_rl" / "wire" / "user_rl_pb2.py"
        target = out_dir / "user_rl_pb2.py"
        target.write_text(produced.read_text())
    return target


def main() -> int:
    generate(WIRE_DIR)
    print(f"wrote {GENERATED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
