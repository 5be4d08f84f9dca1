"""The algebraic search: egglog encoding, staged saturation, top-k extraction,
candidate verification. The only part of cleave that imports egglog."""
from .api import SearchResult, search
from .check import CandidateMismatch, check_candidate
from .saturate import BudgetWarning, Budgets

__all__ = ["BudgetWarning", "Budgets", "CandidateMismatch", "SearchResult", "check_candidate", "search"]
