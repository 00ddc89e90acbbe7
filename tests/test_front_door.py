"""What a new user meets first: README's install and test lines are the ones .ci/run runs, and the extra
they install, ``test``, holds every optional package that a test of the suite skips without."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _extra_packages(extras: dict[str, list[str]], name: str) -> set[str]:
    """The packages an extra brings, following ``transformer-xl[...]`` references to other extras."""
    found = set()
    for requirement in extras[name]:
        inner = re.fullmatch(r"transformer-xl\[([a-z0-9,-]+)\]", requirement)
        if inner:
            for other in inner.group(1).split(","):
                found |= _extra_packages(extras, other)
        else:
            found.add(_requirement_name(requirement))
    return found


def test_ci_runs_the_readme_install_and_test_lines():
    script = (REPO / ".ci" / "run").read_text()
    function = re.search(r"^quick_start\(\) \{.*?^\}$", script, re.S | re.M).group(0)
    readme = (REPO / "README.md").read_text().splitlines()
    marker = next(i for i, line in enumerate(readme) if line.startswith("<!-- ci: "))
    assert readme[marker + 1] == "```bash"
    block = readme[marker + 2 : readme.index("```", marker + 2)]

    def ci_reads(start: str) -> list[str]:
        out = subprocess.run(
            ["bash", "-c", f'{function}\nquick_start "{start}"'], cwd=REPO, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    assert ci_reads("pip install ") == [line for line in block if line.startswith("pip install ")]
    assert ci_reads("python3 -m pytest") == ["python3 -m pytest -q                 # 2. the test suite"]
    assert any('pip install -e ".[test]"' in line for line in block)


def test_the_test_extra_brings_every_package_a_skip_reason_names():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    suite = _extra_packages(extras, "test")
    named = set()
    for path in (REPO / "tests").glob("*.py"):
        named |= set(
            re.findall(r"pip install (?:-e )?['\"](?:transformer-xl|\.)\[([a-z0-9-]+)\]", path.read_text())
        )
    assert {"plots", "notebook", "test-ref", "serve", "serve-test", "export", "datasets"} <= named
    for extra in sorted(named - {"test"}):
        missing = _extra_packages(extras, extra) - suite
        assert not missing, (
            f"the 'test' extra lacks {sorted(missing)} of '{extra}', which a test skips without"
        )
