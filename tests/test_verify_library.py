"""The shipped rule library against the verifier."""
from __future__ import annotations

import pytest

from cleave.verify.check import _refute


def _rules():
    rules = pytest.importorskip("cleave.rules")
    return rules.all_rules()


def test_no_library_rule_has_a_counterexample():
    """Shapes (z3, every binding) and the fp64 numeric gate on every rule instance."""
    for rule in _rules():
        for inst in rule.instances():
            status, method, cex, notes, _ = _refute(inst)
            assert status != "unsound", f"{rule.name}: {method}: {cex}"
            assert status == "proven", f"{rule.name}: {notes}"


@pytest.mark.slow
def test_the_whole_library_is_proven(tmp_path, monkeypatch):
    from cleave.verify import require_sound

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    require_sound(_rules())
