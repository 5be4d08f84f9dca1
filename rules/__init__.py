"""The rule library (installed as cleave.rules)."""
