"""The committed user_rl_pb2.py must be what protoc makes of the committed user_rl.proto.

Editing the schema without regenerating (python -m user_rl.wire.generate) fails here. The
comparison is on the serialized file descriptor, not the file text, so protoc's version
header does not matter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from user_rl.wire import generate as gen
from user_rl.wire import user_rl_pb2


def serialized_descriptor(module_path: Path) -> bytes:
    """The bytes a generated module hands to `AddSerializedFile`, read without importing it."""
    tree = ast.parse(module_path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            return ast.literal_eval(node.args[0])
    raise AssertionError(f"{module_path} has no AddSerializedFile call")


def test_committed_module_matches_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    regenerated = gen.generate(tmp_path)
    fresh = serialized_descriptor(regenerated)
    committed = serialized_descriptor(gen.GENERATED)
    if fresh != committed:
        a = descriptor_pb2.FileDescriptorProto.FromString(committed)
        b = descriptor_pb2.FileDescriptorProto.FromString(fresh)
        old = {m.name for m in a.message_type}
        new = {m.name for m in b.message_type}
        pytest.fail(
            "user_rl_pb2.py is stale: run `python -m user_rl.wire.generate` "
            f"(messages only in proto: {sorted(new - old)}, only in pb2: {sorted(old - new)})"
        )


def test_committed_module_is_the_one_imported() -> None:
    # The imported module's descriptor is the committed bytes (no stray copy on sys.path).
    assert Path(user_rl_pb2.__file__).resolve() == gen.GENERATED
    assert user_rl_pb2.DESCRIPTOR.serialized_pb == serialized_descriptor(gen.GENERATED)
    assert user_rl_pb2.DESCRIPTOR.name == "user_rl/wire/user_rl.proto"


def test_committed_module_loads_on_the_oldest_protobuf_the_package_accepts() -> None:
    """Generated code refuses a runtime older than its protoc; LeRobot's environment has protobuf 6."""
    text = gen.GENERATED.read_text()
    generated = tuple(int(n) for n in text.split("# Protobuf Python Version: ")[1].split()[0].split("."))
    pyproject = (gen.WIRE_DIR.parent.parent / "pyproject.toml").read_text()
    floor = tuple(int(n) for n in pyproject.split('"protobuf>=')[1].split('"')[0].split("."))
    assert generated <= floor, (
        f"user_rl_pb2.py needs protobuf >= {generated} but pyproject.toml accepts "
        f"{floor}: regenerate with the old protoc (see user_rl/wire/generate.py)"
    )
