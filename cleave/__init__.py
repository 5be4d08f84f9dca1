"""cleave: fused GPU kernels derived from naive tensor programs.

The top-level names are the public API; heavy parts (egglog, z3, triton) load
only when the function that needs them is called.
"""
from .interpreter import interpret
from .ir import BindingError, CleaveError, DType, Graph, ParseError, ShapeError, parse_graph

__version__ = "0.1.0"

__all__ = [
    "BindingError", "CleaveError", "DType", "Graph", "ParseError", "ShapeError", "__version__",
    "capture", "compile", "explain", "interpret", "parse_graph",
]


def capture(fn, *example_inputs, dynamic=None, name=None):
    """Trace a PyTorch function into an IR graph with symbolic dims (see cleave.frontends)."""
    from .frontends.capture import capture as _capture

    return _capture(fn, *example_inputs, dynamic=dynamic, name=name)


def compile(fn, dynamic=None, device=None, top_k=4, verbose=None, rules=None, artifact=None, candidates=1):
    """Compile `fn` once for every shape along its dynamic axes (see cleave.runtime.compile,
    whose parameters these are, with the same defaults: tests/test_artifacts_cli_logging.py
    checks that they stay so). `artifact`: a directory its operators are written to
    (`compiled.prepare` on meta tensors, where egglog and z3 are) and loaded from (on a GPU
    box with torch and triton). `candidates`: how many of the search's first candidates
    each operator ranks by its plans' cost."""
    from .runtime.compile import compile as _compile

    return _compile(fn, dynamic=dynamic, device=device, top_k=top_k, verbose=verbose, rules=rules,
                    artifact=artifact, candidates=candidates)


def explain(compiled, *args, **kwargs):
    """Report what cleave did for one call of a function or module compiled by cleave.compile
    or torch.compile(backend="cleave") (see cleave.runtime.explain)."""
    from .runtime.explain import explain as _explain

    return _explain(compiled, *args, **kwargs)


def search(graph, top_k=5, **kwargs):
    """Algebraic search: the top-k rewritten candidates of a graph (see cleave.search)."""
    from .search import search as _search

    return _search(graph, top_k=top_k, **kwargs)


def schedule(candidate, shapes, dynamic=(), top_k=4, **kwargs):
    """Ranked Triton plans for a candidate at concrete shapes (see cleave.scheduler)."""
    from .scheduler import schedule as _schedule

    return _schedule(candidate, shapes, dynamic=dynamic, top_k=top_k, **kwargs)
