"""The one textual form of a graph: printed for errors, snapshots and artifacts,
and parsed back to an equal graph.

    graph attention {
      %0 = input(name="q", shape=[b,h,s,d], dtype=bf16) : bf16[b,h,s,d]
      %3 = matmul(%0, %2) : bf16[b,h,s,s]
      %4 = reduce(%3, op="max", axis=3, keepdim=1) : bf16[b,h,s,1]
      return o=%9
    }
"""
from __future__ import annotations

import json
import math
import re

import sympy

from . import dims as D
from .errors import CleaveError, ParseError
from .ops import SPECS


def _fmt_value(kind: str, value) -> str:
    if kind == "shape":
        return D.fmt_shape(value).replace(" ", "")
    if kind == "dim":
        return D.fmt(value)
    if kind == "ints":
        return "[" + ",".join(str(v) for v in value) + "]"
    if kind == "float":
        if value is None:
            return "none"
        if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
            return str(value)
        return repr(value)
    if kind == "str":
        return json.dumps(value)
    return str(value)


def _order(graph):
    inputs = list(graph.inputs.values())
    return inputs + [n for n in graph.live_nodes() if n.op != "input"]


def print_graph(graph, name: bool = True) -> str:
    nodes = _order(graph)
    ids = {n.id: k for k, n in enumerate(nodes)}
    lines = [f"graph {graph.name if name else '_'} {{"]
    for n in nodes:
        spec = SPECS[n.op]
        args = [f"%{ids[x.id]}" for x in n.inputs]
        args += [f"{k}={_fmt_value(kind, n.attrs[k])}" for k, kind in spec.attrs]
        lines.append(f"  %{ids[n.id]} = {n.op}({', '.join(args)}) : {n.dtype}{D.fmt_shape(n.shape).replace(' ', '')}")
    # what every binding must satisfy beyond the nodes' own checks (a split's "no empty
    # chunk", a size torch traced a branch on): the text keeps them, sorted to be canonical
    lines += sorted(f"  require {D.fmt(c.lhs)} {_SIGNS[c.kind]} {D.fmt(c.rhs)} from {json.dumps(c.origin)}"
                    for c in graph.live_constraints({n.id for n in nodes}))
    outs = ", ".join(f"{nm}=%{ids[o.id]}" for nm, o in zip(graph.output_names, graph.outputs))
    lines.append(f"  return {outs}".rstrip())
    lines.append("}")
    return "\n".join(lines) + "\n"


_HEADER = re.compile(r"^graph\s+(.*?)\s*\{$")  # any name the builder took: "my graph" reads back
_NODE = re.compile(r"^%(\d+)\s*=\s*(\w+)\((.*)\)\s*:\s*(\w+)(\[.*\])$")
_RETURN = re.compile(r"^return\s*(.*)$")
_REQUIRE = re.compile(r'^require\s+(.+?)\s+(<=|==|\|)\s+(.+?)\s+from\s+(".*")$')
_SIGNS = {"le": "<=", "eq": "==", "divides": "|"}
_KINDS = {sign: kind for kind, sign in _SIGNS.items()}


def _split_args(text: str) -> list[str]:
    out, depth, cur, quoted = [], 0, [], False
    for ch in text:
        if ch == '"' and (not cur or cur[-1] != "\\"):
            quoted = not quoted
        if not quoted:
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == "," and depth == 0:
                out.append("".join(cur).strip())
                cur = []
                continue
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _parse_dim(text: str):
    """A dim as the builder takes it: an integer literal is checked as one, and an
    expression that is a number must not be negative either."""
    text = text.strip()
    d = D.dim(int(text)) if re.fullmatch(r"-?\d+", text) else D.dim(text)
    if d.is_number and d < 0:
        raise ValueError(f"a dimension cannot be negative ({text})")
    return d


def _constraint_side(text: str):
    """A side of a `require`: an expression of dims that may be negative (torch's guard
    of a slice from the end, `-floor(n/2) <= -1`), which a dim may not."""
    text = text.strip()
    return -D.dim(text[1:]) if re.fullmatch(r"-\s*\d+", text) else D.dim(text)


def _parse_value(kind: str, text: str):
    if kind == "shape":
        inner = text.strip()[1:-1].strip()
        return tuple(_parse_dim(t) for t in _split_args(inner)) if inner else ()
    if kind == "dim":
        return _parse_dim(text)
    if kind == "ints":
        inner = text.strip()[1:-1].strip()
        return tuple(int(t) for t in inner.split(",")) if inner else ()
    if kind == "int":
        return int(text)
    if kind == "float":
        if text == "none":
            return None
        return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
    if kind == "str":
        return json.loads(text)
    return text


def _same_type(node, dtype: str, shape: str) -> bool:
    """The annotation names node's type in another form of its dims: sympy prints
    3·(s + 2)·(t + 2) as built, and as (3·s + 6)·(t + 2) rebuilt from the text (a
    convolution's flattened, padded input)."""
    try:
        dims = _parse_value("shape", shape)
    except Exception:  # noqa: BLE001 - an annotation that does not parse matches nothing
        return False
    return str(node.dtype) == dtype and len(dims) == len(node.shape) and \
        all(D.equal(a, b) for a, b in zip(dims, node.shape))


def parse_graph(text: str):
    """The graph of a text form (print_graph's), checked as the builder checks: an error
    names the line (of `text`) and what is wrong."""
    from .graph import Graph

    if not isinstance(text, str):
        raise TypeError(f"parse_graph: text must be a str (a graph's text form), got {type(text).__name__}")
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), start=1)
             if ln.strip() and not ln.strip().startswith("#")]
    if not lines or not _HEADER.match(lines[0][1]) or lines[-1][1] != "}":
        raise ParseError("a graph starts with 'graph NAME {' and ends with '}'")
    graph = Graph(_HEADER.match(lines[0][1]).group(1))
    nodes = {}
    returned = False
    for lineno, line in lines[1:-1]:
        if returned:
            raise ParseError(f"line {lineno}: {line!r} follows the 'return' line, which ends a graph")
        returned = bool(_RETURN.match(line))
        try:
            _parse_line(graph, nodes, line, lineno)
        except ParseError:
            raise
        except CleaveError as err:  # the builder's (a ShapeError): its class kept, the line added
            err.args = (f"line {lineno}: {err.args[0]}", *err.args[1:])
            raise
        except (ValueError, TypeError, ArithmeticError, sympy.SympifyError) as err:
            raise ParseError(f"line {lineno}: {line!r}: {err}") from None
    if not returned:  # a graph of no outputs prints `return` alone
        raise ParseError(f"line {lines[-1][0]}: the graph ends without a 'return' line (e.g. 'return out=%3')")
    return graph


def _parse_line(graph, nodes: dict, line: str, lineno: int) -> None:
    """One `return`, `require` or `%N = op(...) : type` line, added to `graph` (`nodes`:
    %N -> node)."""
    ret = _RETURN.match(line)
    if ret:
        pairs = [p.split("=") for p in _split_args(ret.group(1))]
        if not pairs:
            return
        try:
            graph.output(*(nodes[int(v.strip()[1:])] for _, v in pairs), names=[k.strip() for k, _ in pairs])
        except (KeyError, ValueError) as err:
            raise ParseError(f"line {lineno}: bad return {line!r}: {err}") from None
        return
    req = _REQUIRE.match(line)
    if req:
        from .graph import Constraint

        lhs, sign, rhs, origin = req.groups()
        try:
            c = Constraint(_KINDS[sign], _constraint_side(lhs), _constraint_side(rhs), json.loads(origin))
        except (ValueError, CleaveError) as err:
            raise ParseError(f"line {lineno}: bad require {line!r}: {err}") from None
        # one the nodes' own checks added again: the printed origin names the printed node
        graph.constraints = [o for o in graph.constraints if (o.kind, o.lhs, o.rhs) != (c.kind, c.lhs, c.rhs)]
        graph._constrain(c)
        return
    m = _NODE.match(line)
    if not m:
        raise ParseError(f"line {lineno}: cannot read {line!r}")
    nid, op, args, dtype, shape = m.groups()
    if int(nid) in nodes:
        raise ParseError(f"line {lineno}: %{nid} is defined twice")
    spec = SPECS.get(op)
    if spec is None:
        raise ParseError(f"line {lineno}: unknown op {op!r}")
    kinds = dict(spec.attrs)
    operands, attrs = [], {}
    for arg in _split_args(args):
        if arg.startswith("%"):
            ref = int(arg[1:])
            if ref not in nodes:
                raise ParseError(f"line {lineno}: %{ref} is used before it is defined")
            operands.append(nodes[ref])
        else:
            key, _, value = arg.partition("=")
            if key not in kinds:
                raise ParseError(f"line {lineno}: {op} has no attribute {key!r}")
            attrs[key] = _parse_value(kinds[key], value.strip())
    node = graph.input(**attrs) if op == "input" else graph.add(op, *operands, **attrs)
    printed = f"{node.dtype}{D.fmt_shape(node.shape).replace(' ', '')}"
    if printed != f"{dtype}{shape.replace(' ', '')}" and not _same_type(node, dtype, shape):
        raise ParseError(f"line {lineno}: %{nid} is annotated {dtype}{shape} but infers {printed}")
    nodes[int(nid)] = node
