"""Before `make` creates .venv: is the interpreter one the toolkit accepts, and is an existing .venv
made from one? (Makefile, the .venv rule; run by that interpreter, so plain Python 3 syntax.)

usage: python tools/venv_check.py PY VENV [GOAL...]   (GOAL: the make goals, for the hint)

- PY's version is checked against pyproject.toml's requires-python first: a refused one stops
  here (exit 2), naming its version, the rule and an accepted interpreter found on PATH, before
  any minute of installs.
- A VENV left by an earlier run whose interpreter is refused, does not run, or is another version
  than PY (venv cannot switch an existing environment's Python) is removed, saying so, so that
  the rule creates it again from PY. Only a directory holding pyvenv.cfg is removed.
"""
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASK = "import platform; print(platform.python_version())"
CANDIDATES = ("python3.13", "python3.12", "python3.11", "python3.10", "python3.14", "python3")


def requires_python():
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        m = re.search(r'^requires-python\s*=\s*"([^"]+)"', fh.read(), re.M)
    return m.group(1) if m else ""


def _tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3]) + (0,) * (3 - len(re.findall(r"\d+", v)[:3]))


def accepted(version, spec):
    """True when `version` (X.Y.Z) satisfies every clause of `spec` (>=, >, <=, <, ==, != with X.Y.*)."""
    have = _tuple(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"(>=|<=|==|!=|>|<)\s*([\d.]+)(\.\*)?$", clause)
        if not m:
            continue
        op, want, wild = m.group(1), m.group(2), m.group(3)
        if wild:
            n = len(want.split("."))
            same = have[:n] == _tuple(want)[:n]
            ok = same if op == "==" else not same
        else:
            w = _tuple(want)
            ok = {">=": have >= w, "<=": have <= w, "==": have == w, "!=": have != w,
                  ">": have > w, "<": have < w}[op]
        if not ok:
            return False
    return True


def version_of(interpreter):
    """The interpreter's X.Y.Z, or None when it does not run."""
    try:
        out = subprocess.run([interpreter, "-c", ASK], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    v = out.stdout.strip()
    return v if out.returncode == 0 and re.match(r"^\d+\.\d+\.\d+", v) else None


def suggestion(spec, goals):
    make = "make %s" % (" ".join(goals) or "venv")
    for name in CANDIDATES:
        path = shutil.which(name)
        v = path and version_of(path)
        if v and accepted(v, spec):
            return "`%s PY=%s` (Python %s)" % (make, path, v)
    return "install Python 3.10.12+, 3.11.4+ or 3.12+, then `%s PY=<it>`" % make


def main(argv):
    if len(argv) < 3:
        print("usage: python tools/venv_check.py PY VENV [GOAL...]", file=sys.stderr)
        return 2
    py, venv, goals = argv[1], argv[2], argv[3:]
    spec = requires_python()
    have = version_of(py)
    if have is None or not accepted(have, spec):
        what = "does not run" if have is None else "is Python %s" % have
        print("error: PY=%s %s; the toolkit needs Python %s (pyproject.toml, requires-python)" % (py, what, spec),
              file=sys.stderr)
        print("hint: %s%s" % (suggestion(spec, goals),
                              "; then the .venv made from %s is rebuilt by itself" % py
                              if os.path.isdir(venv) else ""), file=sys.stderr)
        return 2
    venv_python = os.path.join(venv, "bin", "python")
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        old = version_of(venv_python)
        why = None
        if old is None:
            why = "its Python does not run"
        elif not accepted(old, spec):
            why = "it was made from Python %s, which the toolkit refuses (%s)" % (old, spec)
        elif old != have:
            why = "it was made from Python %s, and PY=%s is Python %s" % (old, py, have)
        if why:
            print("removing %s to make it again from %s: %s" % (venv, py, why))
            shutil.rmtree(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
