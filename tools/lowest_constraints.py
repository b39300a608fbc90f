"""Print pip constraints that pin every runtime dependency of pyproject.toml to its declared floor (`>=X` -> `==X`).

`make test-min-deps` installs the project with these constraints and runs the tests that use each dependency, so a
floor that the code has outgrown fails there instead of on a user's machine. A runtime dependency declared without a
floor is an error: its lowest version would be whatever pip finds, which nobody has tested.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*>=\s*([A-Za-z0-9.]+)\s*(?:,.*)?$")


def lowest_constraints(pyproject: Path) -> list[str]:
    dependencies = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        match = REQUIREMENT.match(requirement.split(";", 1)[0])
        if match is None:
            raise SystemExit(f"{pyproject}: {requirement!r} has no '>=' floor; declare the lowest version that works")
        name, _extras, floor = match.groups()
        pins.append(f"{name}=={floor}")
    return pins


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    print("\n".join(lowest_constraints(root / "pyproject.toml")))
