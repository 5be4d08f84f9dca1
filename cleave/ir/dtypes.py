"""Element types of the IR, independent of any tensor library."""
from __future__ import annotations

import enum


class DType(enum.Enum):
    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
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
        return self in (DType.i32, DType.i64)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self.value]


_ALIASES = {
    "float64": "f64", "double": "f64", "float32": "f32", "float": "f32",
    "float16": "f16", "half": "f16", "bfloat16": "bf16",
    "int64": "i64", "long": "i64", "int32": "i32", "int": "i32",
}

_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "bool": 1}

# Promotion order among floats: the larger rank wins; f16 with bf16 meets at f32.
_FLOAT_RANK = {DType.bf16: 1, DType.f16: 1, DType.f32: 2, DType.f64: 3}


def dtype(value: "DType | str") -> DType:
    """Read a dtype from its IR name or a common alias ('bfloat16', 'float32')."""
    if isinstance(value, DType):
        return value
    name = str(value).removeprefix("torch.")
    try:
        return DType(_ALIASES.get(name, name))
    except ValueError:
        names = ", ".join(d.value for d in DType)
        raise ValueError(f"unknown dtype {value!r}; expected one of {names}") from None


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
    if DType.i64 in (a, b):
        return DType.i64
    if DType.i32 in (a, b):
        return DType.i32
    return DType.bool


# The float types whose every value each float type holds exactly (f16 and bf16 each
# have values the other lacks: range against precision).
_HOLDS = {DType.f64: {DType.f64, DType.f32, DType.f16, DType.bf16}, DType.f32: {DType.f32, DType.f16, DType.bf16},
          DType.f16: {DType.f16}, DType.bf16: {DType.bf16}}


def rounds(source: DType, target: DType) -> bool:
    """Whether a float-to-float cast can change a value (it narrows): such a cast
    is part of what a program computes, never a value identity."""
    return source.is_float and target.is_float and source not in _HOLDS[target]
