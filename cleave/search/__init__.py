"""The algebraic search: egglog encoding, staged saturation, top-k extraction,
candidate verification. The only part of cleave that imports egglog."""
import sys

from .api import CandidateRejected, SearchResult, search
from .validate import CandidateMismatch, check_candidate
from .saturate import BudgetWarning, Budgets

__all__ = ["BudgetWarning", "Budgets", "CandidateMismatch", "CandidateRejected", "SearchResult", "check_candidate",
           "search"]


class _CallableModule(type(sys.modules[__name__])):
    """`cleave.search(graph)` is the public entry point, but importing this package
    rebinds the attribute `cleave.search` to the package itself; calling the package
    therefore runs the search, whichever of the two a caller holds."""

    def __call__(self, graph, **kwargs) -> SearchResult:
        return search(graph, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
