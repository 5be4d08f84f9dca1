"""cleave.search."""
