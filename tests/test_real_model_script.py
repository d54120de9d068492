"""scripts/real_model.py's checks of an assembled model, on small GGUF files made here."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from types import ModuleType

import pytest

from waystation.testing.workers import REPO


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_model", REPO / "scripts" / "real_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["real_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


real_model = _script()


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf(tensors: list[tuple[str, list[int], int, int]], data_bytes: int) -> bytes:
    """A GGUF v3 file: one metadata key, `tensors` as (name, dims, ggml type, offset)."""
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    header += _string("general.architecture") + struct.pack("<I", 8) + _string("test")
    for name, dims, kind, offset in tensors:
        header += _string(name) + struct.pack("<I", len(dims))
        header += b"".join(struct.pack("<Q", d) for d in dims)
        header += struct.pack("<IQ", kind, offset)
    header += b"\0" * (-len(header) % 32)
    return header + b"\1" * data_bytes


# Two tensors: 64 F32 values (256 bytes) at 0, then 256 Q4_K values (one 144-byte block).
TENSORS = [("a", [8, 8], 0, 0), ("b", [256], 12, 256)]


def test_a_whole_file_passes_and_reports_where_the_last_tensor_ends(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(TENSORS, 256 + 144))
    summary = real_model.check_gguf(path)
    assert summary.tensors == 2 and summary.metadata["general.architecture"] == "test"
    assert summary.data_end == summary.file_size


def test_a_truncated_file_fails(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(TENSORS, 256 + 100))
    with pytest.raises(real_model.ModelFileError, match="the last tensor ends at"):
        real_model.check_gguf(path)


def test_a_file_with_a_piece_too_many_fails(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf(TENSORS, 256 + 144 + 4096))
    with pytest.raises(real_model.ModelFileError, match="the last tensor ends at"):
        real_model.check_gguf(path)


def test_overlapping_tensors_and_other_files_fail(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf([("a", [8, 8], 0, 0), ("b", [256], 12, 128)], 128 + 144))
    with pytest.raises(real_model.ModelFileError, match="overlaps"):
        real_model.check_gguf(path)
    path.write_bytes(b"PK\3\4 not a model")
    with pytest.raises(real_model.ModelFileError, match="not a GGUF"):
        real_model.check_gguf(path)
