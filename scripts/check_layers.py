#!/usr/bin/env python3
"""Checks that no module includes a module on a higher floor.

The floors are the order of add_subdirectory() in src/CMakeLists.txt (lowest first); a module's
files are src/<module>/** and include/dlprobe/<module>/**. A file may include the public headers of
its own module and of modules listed before it. The umbrella header include/dlprobe/dlprobe.h must
include every public header. Prints each include that runs up, and each header the umbrella lacks,
and exits 1 when there is one.

    scripts/check_layers.py [ROOT]
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"dlprobe/([a-z_]+)/', re.MULTILINE)
SUBDIR = re.compile(r"^\s*add_subdirectory\(([a-z_]+)\)", re.MULTILINE)


def floors(root: pathlib.Path) -> list[str]:
    return SUBDIR.findall((root / "src" / "CMakeLists.txt").read_text())


def module_of(root: pathlib.Path, path: pathlib.Path) -> str | None:
    rel = path.relative_to(root).parts
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    if rel[:2] == ("include", "dlprobe") and len(rel) > 3:
        return rel[2]
    return None


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    order = floors(root)
    if not order:
        print(f"check_layers: no add_subdirectory() in {root}/src/CMakeLists.txt", file=sys.stderr)
        return 2
    floor = {name: i for i, name in enumerate(order)}
    up = []
    files = [*(root / "src").rglob("*"), *(root / "include" / "dlprobe").rglob("*")]
    for path in sorted(files):
        if path.suffix not in {".h", ".cpp", ".cu", ".cuh", ".in"}:
            continue
        mod = module_of(root, path)
        if mod not in floor:
            continue
        for m in INCLUDE.finditer(path.read_text()):
            target = m.group(1)
            if target in floor and floor[target] > floor[mod]:
                line = path.read_text().count("\n", 0, m.start()) + 1
                up.append(f"{path.relative_to(root)}:{line}: {mod} includes {target}, a higher floor")
    umbrella = root / "include" / "dlprobe" / "dlprobe.h"
    if umbrella.exists():
        listed = set(re.findall(r'#include "(dlprobe/[a-z_]+/[a-z_]+\.h)"', umbrella.read_text()))
        for header in sorted((root / "include" / "dlprobe").glob("*/*.h")):
            name = str(header.relative_to(root / "include"))
            if name not in listed:
                up.append(f"include/dlprobe/dlprobe.h: does not include {name}")
    for u in up:
        print(u)
    print(f"check_layers: {len(up)} problem(s): includes up the floors ({' < '.join(order)})")
    return 1 if up else 0


if __name__ == "__main__":
    sys.exit(main())
