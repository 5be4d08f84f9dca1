"""`cleave rules verify FILES`: one line per rule, non-zero exit naming the failing rule."""
from __future__ import annotations

import pytest

from cleave.cli.main import main


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    from cleave.verify import verdict

    monkeypatch.setenv("CLEAVE_CACHE_DIR", str(tmp_path / "cache"))
    verdict.clear_memory()


def _file(tmp_path, text):
    path = tmp_path / "my_rules.txt"
    path.write_text(text)
    return str(path)


GOOD = """family algebra

rule my-div-mul-assoc: mul(div(x, y), z) => div(mul(x, z), y)
  why: (x / y) * z = (x * z) / y
"""

BAD = GOOD + """
rule my-exp-add-wrong: exp(add(x, y)) => add(exp(x), exp(y))
  why: deliberately wrong
"""


def test_verify_file_of_sound_rules(tmp_path, capsys):
    assert main(["rules", "verify", _file(tmp_path, GOOD)]) == 0
    out = capsys.readouterr().out
    assert "my-div-mul-assoc" in out and "proven" in out and "1/1 rules proven" in out


def test_verify_names_the_unsound_rule(tmp_path, capsys):
    path = _file(tmp_path, BAD)
    assert main(["rules", "verify", path]) == 1
    captured = capsys.readouterr()
    assert "my-exp-add-wrong" in captured.out and "unsound" in captured.out
    assert f"FAILED {path}:6: rule 'my-exp-add-wrong' is unsound" in captured.err and "lhs=" in captured.err


@pytest.mark.parametrize("command", ["verify", "list"])
def test_a_missing_rule_file_is_one_clear_line(command, tmp_path, capsys):
    path = tmp_path / "missing.txt"
    assert main(["rules", command, str(path)]) == 2
    assert capsys.readouterr().err == f"cleave rules: error: {path}: no such rule file\n"


@pytest.mark.parametrize("path, message", [("", "a rule file path is empty"),  # was "Is a directory: '.'"
                                           (".", ".: a directory, not a rule file")])
def test_an_empty_path_or_a_directory_is_one_clear_line(path, message, capsys):
    assert main(["rules", "list", path]) == 2
    assert capsys.readouterr().err == f"cleave rules: error: {message}\n"


def test_listing_a_file_without_rules_is_an_error(tmp_path, capsys):
    path = _file(tmp_path, "family algebra\n")
    assert main(["rules", "list", path]) == 2
    assert capsys.readouterr().err == f"cleave rules: error: no rules in {path}\n"


def test_verify_refuses_a_name_the_library_has(tmp_path, capsys):
    # `optimize --rules` and `cleave.compile(rules=)` refuse it: verify said proven first
    path = _file(tmp_path, GOOD.replace("my-div-mul-assoc", "softmax-shift"))
    assert main(["rules", "verify", path]) == 2
    err = capsys.readouterr().err
    assert "softmax-shift is defined twice" in err and path in err


def test_verify_names_a_file_that_is_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.rules"
    path.write_bytes(b"family algebra\n\xff rule\n")
    assert main(["rules", "verify", str(path)]) == 2
    assert f"{path}: not UTF-8 text" in capsys.readouterr().err
