"""A streaming safetensors writer: the header is computed from shapes and dtypes, then
each tensor is loaded, written and released, so converting a checkpoint never holds
more than one tensor in memory (safetensors' own save_file needs all of them).

Layout (the published format): 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}} padded with
spaces to a multiple of 8, then the tensors' bytes back to back in header order.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Callable, Sequence

import torch

# torch dtype <-> safetensors dtype name
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
for _name, _code in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        DTYPE_NAMES[getattr(torch, _name)] = _code
DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}


def nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def write_safetensors(path: Path, tensors: Sequence, on_bytes: Callable[[int, str], None] = lambda n, name: None) -> None:
    """Write ``tensors`` (objects with name, shape, dtype, nbytes and load()) to ``path``.

    load() must return exactly the declared shape and dtype (checked: a mismatch would
    corrupt the offsets of every later tensor).
    """
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"{t.name}: dtype {t.dtype} has no safetensors equivalent")
        header[t.name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors:
            value = t.load()
            if tuple(value.shape) != tuple(t.shape) or value.dtype != t.dtype:
                raise ValueError(
                    f"{t.name}: read {list(value.shape)} {value.dtype}, but its header says "
                    f"{list(t.shape)} {t.dtype}"
                )
            data = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            f.write(memoryview(data))
            on_bytes(t.nbytes, t.name)
            del value, data
