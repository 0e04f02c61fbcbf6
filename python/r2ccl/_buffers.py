"""Turn buffer-protocol objects and torch tensors into (address, size, dtype) for the extension."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional

# r2ccl's element types, by the struct format character and item size of a buffer.
_SIGNED = {1: "i8", 4: "i32", 8: "i64"}
_UNSIGNED = {1: "u8", 4: "u32", 8: "u64"}
_FLOAT = {"e": "f16", "f": "f32", "d": "f64"}
SIZES = {"i8": 1, "u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8}

# A byte to point at for empty buffers (the extension refuses null addresses).
_EMPTY = bytearray(1)
_EMPTY_ADDR = ctypes.addressof(ctypes.c_char.from_buffer(_EMPTY))


class Buffer:
    """A contiguous region of host memory: its address, byte size, element type and owner
    (kept referenced while a call uses the region)."""

    __slots__ = ("addr", "nbytes", "dtype", "owner")

    def __init__(self, addr: int, nbytes: int, dtype: str, owner: Any) -> None:
        self.addr = addr if nbytes else _EMPTY_ADDR
        self.nbytes = nbytes
        self.dtype = dtype
        self.owner = owner

    @property
    def count(self) -> int:
        """Elements."""
        return self.nbytes // SIZES[self.dtype]


def torch_dtype_name(t: Any) -> Optional[str]:
    """r2ccl's name for a torch tensor's dtype, or None when r2ccl has no such type."""
    import torch

    return {
        torch.float32: "f32",
        torch.float64: "f64",
        torch.float16: "f16",
        torch.bfloat16: "bf16",
        torch.int8: "i8",
        torch.uint8: "u8",
        torch.bool: "u8",
        torch.int32: "i32",
        torch.int64: "i64",
        torch.uint32: "u32",
        torch.uint64: "u64",
    }.get(t.dtype)


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def as_buffer(obj: Any, writable: bool, dtype: Optional[str] = None, cuda_ok: bool = False) -> Buffer:
    """The region of ``obj``: a C-contiguous buffer-protocol object or a contiguous CPU tensor
    (or CUDA tensor, with ``cuda_ok``: its address is a device address). ``writable`` refuses
    read-only memory; ``dtype`` overrides the element type."""
    if isinstance(obj, Buffer):
        return obj
    if _is_tensor(obj):
        if obj.device.type != "cpu" and not (cuda_ok and obj.device.type == "cuda"):
            where = "collectives (not send/recv or numpy-style calls)" if obj.device.type == "cuda" else "nothing"
            raise TypeError(f"r2ccl: a {obj.device.type} tensor; r2ccl takes CPU tensors, and CUDA tensors in {where}")
        if not obj.is_contiguous():
            raise ValueError("r2ccl: the tensor is not contiguous")
        name = dtype or torch_dtype_name(obj)
        if name is None:
            raise TypeError(f"r2ccl: dtype {obj.dtype} is not supported (r2ccl has {', '.join(SIZES)})")
        return Buffer(obj.data_ptr(), obj.numel() * obj.element_size(), name, obj)
    mv = memoryview(obj)
    if mv.format[:1] in (">", "!") and sys.byteorder == "little" or mv.format[:1] == "<" and sys.byteorder == "big":
        raise TypeError(f"r2ccl: buffer format {mv.format!r} is not in this machine's byte order")
    if not mv.c_contiguous:
        raise ValueError("r2ccl: the buffer is not C-contiguous")
    name = dtype or _format_dtype(mv.format, mv.itemsize)
    if mv.nbytes == 0:
        return Buffer(0, 0, name, obj)
    if mv.readonly:
        if writable:
            raise ValueError("r2ccl: the buffer is read-only")
        copy = bytearray(mv.cast("B"))  # a send buffer: read once, from a writable copy
        return Buffer(ctypes.addressof(ctypes.c_char.from_buffer(copy)), mv.nbytes, name, copy)
    flat = mv.cast("B")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(flat))
    # The export (`flat`) is kept: while it lives the object cannot resize or unmap its memory.
    return Buffer(addr, mv.nbytes, name, (obj, flat))


def _format_dtype(fmt: str, itemsize: int) -> str:
    code = fmt.lstrip("@=<>!")
    if code in _FLOAT and len(code) == 1:
        return _FLOAT[code]
    if code == "?":
        return "u8"
    if code in ("b", "h", "i", "l", "q") and itemsize in _SIGNED:
        return _SIGNED[itemsize]
    if code in ("B", "H", "I", "L", "Q", "c") and itemsize in _UNSIGNED:
        return _UNSIGNED[itemsize]
    raise TypeError(f"r2ccl: buffer format {fmt!r} ({itemsize} bytes) is not supported (r2ccl has {', '.join(SIZES)})")
