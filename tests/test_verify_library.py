"""The shipped rule library against the verifier, cold (a fresh cache dir, as in CI)."""
from __future__ import annotations

import cleave.rules as rules
from cleave.verify import check, require_sound, verdict


def test_the_whole_library_is_proven_cold_then_free(tmp_path, monkeypatch):

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path))
    verdict.clear_memory()
    library = rules.all_rules()
    verdicts = require_sound(library)  # UnsoundRule names any rule not proven, with why
    assert not any(v.cached for v in verdicts)
    assert {v.rule for v in verdicts} >= {"topk-softmax-values", "topk-softmax-indices"}
    verdict.clear_memory()  # as a fresh process would: from disk, without rebuilding instances

    def rebuilt(rule):
        raise AssertionError(f"{rule.name}: instances rebuilt for a cached verdict")

    monkeypatch.setattr(check, "_instances", rebuilt)
    again = require_sound(rules.all_rules())
    assert all(v.cached for v in again)
