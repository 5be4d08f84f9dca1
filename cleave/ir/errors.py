"""Errors raised by the IR. Every message names the op and the operand at fault."""


class CleaveError(Exception):
    """Base class of every error cleave raises on purpose."""


class ShapeError(CleaveError, ValueError):
    """Two shapes disagree, or an attribute does not fit the operand's shape."""


class DimMismatch(ShapeError):
    """Two dims that must be equal (a MatMul's contracted dims, broadcast dims other
    than 1) are not: `.dims` holds both."""

    def __init__(self, message: str, dims: tuple):
        super().__init__(message)
        self.dims = dims


class ParseError(CleaveError, ValueError):
    """The textual form of a graph could not be read."""


class BindingError(CleaveError, ValueError):
    """Concrete tensor shapes do not fit a graph's symbolic shapes or constraints."""
