"""The scheduler and Triton codegen (installed as cleave.scheduler)."""
