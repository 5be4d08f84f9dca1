"""cleave.frontends."""
