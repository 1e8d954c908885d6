"""Build the student copy of the repository: `python scripts/kit/make_student.py DIR` (or
`make student DIR=...`).

Copies the tracked files (no .venv, runs, .git) to DIR and replaces every marked exercise body, the
lines between a `# >>> exercise k: <what>` comment and its `# <<< exercise k`, by

    raise NotImplementedError("Exercise k: <what>; see ASSIGNMENTS.md")

at the body's indentation. The marker comments and the docstring stay, so the student sees where to
write; everything else is copied byte for byte. The kit's own test (tests/test_student_kit.py) is
left out of the copy: it compares the copy with the reference and would fail there by design. See
ASSIGNMENTS.md."""

import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))   # two folders up
BEGIN = re.compile(r"^(\s*)# >>> exercise (\d+): (.+?)\s*$")
END = re.compile(r"^(\s*)# <<< exercise (\d+)\s*$")
SKIP_DIRS = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", "out"}
LEAVE_OUT = {os.path.join("tests", "test_student_kit.py")}


def tracked_files(root: str) -> list[str]:
    """The repository's tracked files (git ls-files); outside a git checkout, every file but the
    SKIP_DIRS."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                             check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(f for f in files if os.path.isfile(os.path.join(root, f)))


def stub(text: str, path: str = "?") -> tuple[str, list[tuple[int, str]]]:
    """The text with each marked body replaced by one raise; also the (k, what) of each region, in
    order. ValueError for an unmatched or nested marker."""
    out = []
    regions = []
    open_ = None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        b = BEGIN.match(line)
        e = END.match(line)
        if b:
            if open_:
                raise ValueError(f"{path}:{n}: exercise {b[2]} begins inside exercise {open_[0]}")
            open_ = (int(b[2]), b[3], b[1], n)
            out.append(line)
        elif e:
            if not open_ or int(e[2]) != open_[0]:
                raise ValueError(f"{path}:{n}: end of exercise {e[2]} without its begin")
            k, what, indent, _ = open_
            msg = f"Exercise {k}: {what}; see ASSIGNMENTS.md"
            lit = f'"{msg}"' if '"' not in msg and "\\" not in msg else repr(msg)
            out.append(f"{indent}raise NotImplementedError({lit})\n")
            out.append(line)
            regions.append((k, what))
            open_ = None
        elif not open_:
            out.append(line)
    if open_:
        raise ValueError(f"{path}:{open_[3]}: exercise {open_[0]} never ends")
    return "".join(out), regions


def make_student(dest: str, root: str = ROOT) -> dict[int, list[str]]:
    """Write the student copy to dest (absent or empty); returns {k: ["file: what", ...]}."""
    dest = os.path.abspath(dest)
    if dest == os.path.abspath(root) or dest.startswith(os.path.abspath(root) + os.sep):
        raise ValueError(f"{dest} is inside the repository: pick a folder outside it "
                         "(e.g. ../student)")
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise ValueError(f"{dest} is a file, not a folder")
    if os.path.exists(dest) and os.listdir(dest):
        raise ValueError(f"{dest} exists and is not empty")
    exercises: dict[int, list[str]] = {}
    for rel in tracked_files(root):
        if rel in LEAVE_OUT or rel.split(os.sep)[0] in SKIP_DIRS:
            continue
        src, dst = os.path.join(root, rel), os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if rel.endswith(".py"):
            with open(src, encoding="utf-8") as f:
                text, regions = stub(f.read(), rel)
            for k, what in regions:
                exercises.setdefault(k, []).append(f"{rel}: {what}")
            with open(dst, "w", encoding="utf-8") as f:
                f.write(text)
            shutil.copymode(src, dst)
        else:
            shutil.copy2(src, dst)
    missing = sorted(set(range(1, max(exercises, default=0) + 1)) - set(exercises))
    if missing:
        raise ValueError(f"exercise numbers must run 1..N; missing {missing}")
    return exercises


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="where to write the student copy (absent or empty)")
    args = ap.parse_args(argv)
    try:
        exercises = make_student(args.dir)
    except ValueError as e:
        sys.exit(f"make_student: {e}")
    print(f"student copy written to {args.dir}: {len(exercises)} exercises")
    for k in sorted(exercises):
        for where in exercises[k]:
            print(f"  {k}. {where}")
    print(f"next: cd {args.dir} && make grade (it creates .venv and installs "
          "requirements.txt first); then see ASSIGNMENTS.md (one exercise: python -m pytest -m "
          "exercise_1 tests)")


if __name__ == "__main__":
    main()
