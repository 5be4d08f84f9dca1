"""The IR: graphs of tensor ops over symbolic dimensions. Depends on nothing else in cleave."""
from .contracts import Candidate, RuleInstance, Separable
from .dims import Dim, cdiv, dim, shape, symbol
from .dtypes import DType, dtype
from .errors import BindingError, CleaveError, DimMismatch, ParseError, ShapeError
from .graph import Constraint, Graph, Node, rebuild
from .text import parse_graph, print_graph

__all__ = [
    "BindingError", "Candidate", "CleaveError", "Constraint", "DType", "Dim", "Graph", "Node", "ParseError", "RuleInstance", "Separable",
    "ShapeError", "DimMismatch", "cdiv", "dim", "dtype", "parse_graph", "print_graph", "rebuild", "shape", "symbol",
]
