"""The workload suite: naive graphs of the LLM subgraphs cleave is measured on."""
from . import attention, attention_variants, decode, flashinfer, mlp, norm_moe  # noqa: F401  (each module registers its workloads)
from .registry import Workload, get, names, random_inputs

__all__ = ["Workload", "get", "names", "random_inputs"]
