"""Regenerate `user_rl_pb2.py` from `user_rl.proto` (needs grpcio-tools).

Generated code refuses to load on a protobuf runtime older than the protoc that made it, and
LeRobot's environment holds protobuf below 7 (wandb's pin). So the committed module is made by an
old protoc, and it loads on every runtime from `pyproject.toml`'s floor on. Regenerate with the
same one, in a venv of its own:

    python -m venv /tmp/pbgen && /tmp/pbgen/bin/pip install grpcio-tools==1.68.1 'protobuf<5.30'
    /tmp/pbgen/bin/python user_rl/wire/generate.py

(tests/wire/test_wire_proto_sync.py checks the module's version against the floor.)
"""

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
