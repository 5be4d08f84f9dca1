"""The README, verbatim: CI runs its test command (`.ci/run`), the main job's
`cleave optimize` runs here (its pip installs are what CI did already), and so does
every Python snippet, each in a fresh interpreter (a snippet defines its own inputs)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def _command_after(intro: str) -> str:
    """The fenced bash block that follows the line starting with `intro`."""
    match = re.search(rf"^{re.escape(intro)}.*?^```bash\n(.*?)\n```", README, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no bash block after {intro!r}"
    return match.group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci_last_line = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert _command_after("Install and run the tests") == ci_last_line


def test_the_readme_main_job_runs():
    command = _command_after("Install and run the main job").split("&&")[-1].strip()
    assert command.startswith("cleave optimize ")
    run = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "# candidate 0" in run.stdout and "# plan at" in run.stdout


SNIPPETS = re.findall(r"^```python\n(.*?)^```", README, re.MULTILINE | re.DOTALL)


def test_the_readme_has_python_snippets():
    assert len(SNIPPETS) >= 4


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_python_snippet_runs(index):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", SNIPPETS[index]], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, f"README snippet {index}:\n{SNIPPETS[index]}\n{run.stderr[-3000:]}"
