"""cleave.verify."""
