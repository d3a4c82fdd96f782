#!/usr/bin/env python3
"""Checks the layout table of docs/architecture.md against the tree: every folder of source code is
in the table, every folder in the table exists, and no file includes a project folder that its
folder's row does not allow ("may include"; `anything` allows all, `–` only the folder itself).
Exits 1 with one line per violation; CI runs it (.ci/run)."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh", ".c")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/', re.M)
# xgrammar's headers: only constrain/'s .cc files may include them, so its types and exceptions
# never leave the files that wrap it.
XGRAMMAR_INCLUDE = re.compile(r'^\s*#\s*include\s+[<"](xgrammar|dlpack|picojson)', re.M)


def table_rows(path):
    """{folder: allowed set, or None for anything} from the layout table's rows."""
    rows = {}
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 3 or not cells[0].startswith("`"):
                continue
            folders = re.findall(r"`([A-Za-z0-9_.]+)/`", cells[0])
            allowed = None if cells[2] == "anything" else set(re.findall(r"[A-Za-z0-9_]+", cells[2]))
            for folder in folders:
                rows[folder] = allowed
    return rows


def source_folders():
    """Top-level folders holding C/C++/CUDA sources (build output and hidden folders aside)."""
    out = set()
    for name in os.listdir(ROOT):
        path = os.path.join(ROOT, name)
        if name.startswith(".") or name.startswith("build") or not os.path.isdir(path):
            continue
        for _, _, files in os.walk(path):
            if any(f.endswith(SOURCE_EXT) for f in files):
                out.add(name)
                break
    return out


def xgrammar_problems():
    """Every include of xgrammar's headers outside constrain/*.cc."""
    out = []
    for folder in sorted(source_folders()):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(f for f in files if f.endswith(SOURCE_EXT)):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                if rel.startswith("constrain/") and name.endswith(".cc"):
                    continue
                with open(path, errors="replace") as f:
                    text = f.read()
                for m in XGRAMMAR_INCLUDE.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    out.append(f"{rel}:{line}: includes xgrammar's headers, which only constrain/*.cc may")
    return out


def main():
    doc = os.path.join(ROOT, "docs/architecture.md")
    rows = table_rows(doc)
    problems = []
    for folder in sorted(source_folders() - set(rows)):
        problems.append(f"{folder}/: holds sources but has no row in docs/architecture.md")
    for folder in sorted(f for f in rows if not os.path.isdir(os.path.join(ROOT, f))):
        problems.append(f"{folder}/: in docs/architecture.md's table but not in the tree")
    for folder, allowed in sorted(rows.items()):
        if allowed is None or not os.path.isdir(os.path.join(ROOT, folder)):
            continue
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target in rows and target != folder and target not in allowed:
                        line = text.count("\n", 0, m.start()) + 1
                        problems.append(f"{os.path.relpath(path, ROOT)}:{line}: includes {target}/, "
                                        f"which {folder}/ may not (docs/architecture.md)")
    problems += xgrammar_problems()
    for p in problems:
        print(p)
    print(f"layout: {len(rows)} folders checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
