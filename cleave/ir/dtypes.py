"""Element types of the IR, independent of any tensor library."""
from __future__ import annotations

import enum
from typing import NamedTuple


class DType(enum.Enum):
    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    bool = "bool"

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"DType.{self.value}"

    @property
    def is_float(self) -> bool:
        return self in _FLOAT_RANK

    @property
    def is_int(self) -> bool:
        return self in _INT_BITS

    @property
    def torch_name(self) -> str:
        """torch.<name> (numpy's name too)."""
        return _TABLE[self].torch

    @property
    def triton_name(self) -> str:
        return _TABLE[self].triton

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _TABLE[self].itemsize

    @property
    def int_range(self) -> tuple[int, int]:
        """(min, max) of an integer type: the neutral elements of its max and min."""
        if not self.is_int:
            raise ValueError(f"{self} is not an integer type")
        bits = 8 * self.itemsize
        if self == DType.u8:
            return 0, 2 ** bits - 1
        return -2 ** (bits - 1), 2 ** (bits - 1) - 1


class _Row(NamedTuple):
    torch: str
    aliases: tuple[str, ...]  # further names the type is read from
    triton: str
    itemsize: int  # bytes


# The one dtype table: every other library's name for a dtype is read from here.
_TABLE = {
    DType.f64: _Row("float64", ("double",), "tl.float64", 8),
    DType.f32: _Row("float32", ("float",), "tl.float32", 4),
    DType.f16: _Row("float16", ("half",), "tl.float16", 2),
    DType.bf16: _Row("bfloat16", (), "tl.bfloat16", 2),
    DType.i64: _Row("int64", ("long",), "tl.int64", 8),
    DType.i32: _Row("int32", ("int",), "tl.int32", 4),
    DType.i16: _Row("int16", ("short",), "tl.int16", 2),
    DType.i8: _Row("int8", (), "tl.int8", 1),
    DType.u8: _Row("uint8", (), "tl.uint8", 1),
    DType.bool: _Row("bool", (), "tl.int1", 1),
}
_NAMES = {name: d for d, row in _TABLE.items() for name in (d.value, row.torch, *row.aliases)}

# The signed integer types by width; uint8 stands beside them.
_INT_BITS = {DType.i8: 8, DType.u8: 8, DType.i16: 16, DType.i32: 32, DType.i64: 64}

# Promotion order among floats: the larger rank wins; f16 with bf16 meets at f32.
_FLOAT_RANK = {DType.bf16: 1, DType.f16: 1, DType.f32: 2, DType.f64: 3}


def dtype(value: "DType | str") -> DType:
    """Read a dtype from its IR name or a common alias ('bfloat16', 'float32')."""
    if isinstance(value, DType):
        return value
    found = _NAMES.get(str(value).removeprefix("torch."))
    if found is None:
        names = ", ".join(d.value for d in DType)
        raise ValueError(f"unknown dtype {value!r}; expected one of {names}")
    return found


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op, torch-like: float beats int, wider beats narrower."""
    if a == b:
        return a
    if a.is_float and b.is_float:
        ra, rb = _FLOAT_RANK[a], _FLOAT_RANK[b]
        if ra == rb:
            return DType.f32
        return a if ra > rb else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    if DType.bool in (a, b):
        return b if a == DType.bool else a
    if DType.u8 in (a, b):  # uint8 with int8 meets at int16, as in torch; a wider signed type holds it
        other = b if a == DType.u8 else a
        return DType.i16 if other == DType.i8 else other
    return a if _INT_BITS[a] > _INT_BITS[b] else b


# The float types whose every value each float type holds exactly (f16 and bf16 each
# have values the other lacks: range against precision).
_HOLDS = {DType.f64: {DType.f64, DType.f32, DType.f16, DType.bf16}, DType.f32: {DType.f32, DType.f16, DType.bf16},
          DType.f16: {DType.f16}, DType.bf16: {DType.bf16}}


def rounds(source: DType, target: DType) -> bool:
    """Whether a float-to-float cast can change a value (it narrows): such a cast
    is part of what a program computes, never a value identity."""
    return source.is_float and target.is_float and source not in _HOLDS[target]
