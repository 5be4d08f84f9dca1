"""cleave.runtime."""
