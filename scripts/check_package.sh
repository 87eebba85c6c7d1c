#!/usr/bin/env bash
# The package as users get it: build the sdist, then the wheel from that sdist, `twine check`
# both, check that every file of django_jobs/ is in each, install the wheel (never the source
# tree) in a fresh virtualenv, and run a copy of example_project/ against it on SQLite: migrate,
# demo, check, makemigrations --check, every template, the admin's pages.
# Everything happens in a temporary directory outside the repository, removed on exit.
# Quiet on success (a few lines); on failure prints the failed step's whole output and exits 1.
# Needs .venv with the dev extra (build, twine): scripts/bootstrap.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=$repo/.venv/bin/python

work=$(mktemp -d "${TMPDIR:-/tmp}/django-jobs-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/step.log

fail() {
  echo >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  echo "!! package check FAILED: $1" >&2
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
  if [ -s "$log" ]; then
    echo "-- output:" >&2
    cat "$log" >&2
  fi
  exit 1
}
trap ': >"$log"; fail "unexpected error at line $LINENO: $BASH_COMMAND"' ERR

# step WHAT COMMAND...: run COMMAND with its output in $log; on failure show it and stop.
step() {
  local what=$1
  shift
  "$@" >"$log" 2>&1 || fail "$what (exit $?)"
}

[ -x "$PY" ] || fail "no .venv: run scripts/bootstrap.sh"
"$PY" -c 'import build, twine' >"$log" 2>&1 || fail "build or twine is missing from .venv: run scripts/bootstrap.sh"

# 1. A copy of the tree as a commit would hold it: tracked files and untracked ones that are not
# ignored. Building from the working tree itself would write into it, and would read a stale
# *.egg-info/SOURCES.txt, which setuptools adds to the sdist: a file dropped from the
# package data would still ship, and this check would not see it.
src=$work/src
mkdir -p "$src"
list_files() {
  if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$repo" ls-files -z --cached --others --exclude-standard
  else
    find . \( -name .git -o -name .venv -o -name '*.egg-info' -o -name __pycache__ -o -name build \
      -o -name dist -o -name '*.sqlite3*' \) -prune -o -type f -print0
  fi
}
existing() { # drop tracked files deleted in the working tree
  local f
  while IFS= read -r -d '' f; do
    if [ -f "$f" ]; then printf '%s\0' "$f"; fi
  done
}
list_files | existing | tar --null -T - -cf - | tar -C "$src" -xf - || fail "copying the source tree to $src"

# 2. sdist, then the wheel built from the unpacked sdist (python -m build's default), so a file
# the sdist lacks is missing from the wheel too.
step "python -m build" "$PY" -m build --outdir "$work/dist" "$src"
sdists=("$work"/dist/*.tar.gz)
wheels=("$work"/dist/*.whl)
[ ${#sdists[@]} -eq 1 ] && [ -f "${sdists[0]}" ] || fail "expected one sdist in $work/dist"
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || fail "expected one wheel in $work/dist"
sdist=${sdists[0]}
wheel=${wheels[0]}

step "twine check --strict" "$PY" -m twine check --strict "$sdist" "$wheel"

# 3. Every file under django_jobs/ (less bytecode) in both archives; README, LICENSE and
# pyproject.toml in the sdist; the licence in the wheel's metadata.
step "contents of the sdist and the wheel" "$PY" - "$src" "$sdist" "$wheel" <<'PY'
import sys
import tarfile
import zipfile
from pathlib import Path

src, sdist, wheel = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
package = sorted(
    p.relative_to(src).as_posix()
    for p in (src / "django_jobs").rglob("*")
    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
)
with tarfile.open(sdist) as t:
    in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
with zipfile.ZipFile(wheel) as z:
    in_wheel = set(z.namelist())
problems = []
for name in [*package, "README.md", "LICENSE", "pyproject.toml"]:
    if name not in in_sdist:
        problems.append(f"sdist lacks {name}")
for name in package:
    if name not in in_wheel:
        problems.append(f"wheel lacks {name}")
if not any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel):
    problems.append("wheel lacks .dist-info/licenses/LICENSE")
for p in problems:
    print(p)
if problems:
    print(f"{len(problems)} problem(s); the source package has {len(package)} files")
    sys.exit(1)
print(f"{len(package)} files of django_jobs/ in the sdist and in the wheel")
PY
nfiles=$(grep -o '^[0-9]* files.*' "$log" || true)

# 4. A fresh virtualenv from .venv's base interpreter, with the wheel and its dependencies only.
base=$("$PY" -c 'import sys; print(sys._base_executable)')
venv=$work/venv
vpy=$venv/bin/python
# .venv's pip installs into it (--python): seeding the venv with its own pip and compiling every
# module to bytecode would double this step's time, and neither is under test.
step "create a virtualenv with $base" "$base" -m venv --without-pip "$venv"
step "pip install the wheel in the fresh venv" \
  "$PY" -m pip --python "$vpy" install --quiet --disable-pip-version-check --no-compile "$wheel"

# 5. The example project, copied out of the repository, against the installed package.
project=$work/project
mkdir -p "$project"
cp -R "$src/example_project" "$project/"
cd "$project/example_project"
templates=$(cd "$src/django_jobs/templates" && find . -type f | sed 's|^\./||' | sort)
export PACKAGE_CHECK_TEMPLATES=$templates
manage=(env -u PYTHONPATH -u PYTHONHOME -u DATABASE_URL -u DJANGO_SETTINGS_MODULE "$vpy" manage.py)

step "manage.py migrate" "${manage[@]}" migrate --verbosity 0
step "manage.py demo" "${manage[@]}" demo
step "manage.py check" "${manage[@]}" check --fail-level WARNING
step "manage.py makemigrations --check --dry-run" "${manage[@]}" makemigrations --check --dry-run
step "templates and admin pages" "${manage[@]}" shell --no-imports -c '
import os
import sys
import sysconfig
from pathlib import Path

import django_jobs

# Imported from the fresh venv, never from a checkout.
site = Path(sysconfig.get_paths()["purelib"]).resolve()
where = Path(django_jobs.__file__).resolve()
print(f"django_jobs: {where}")
if site not in where.parents:
    sys.exit(f"django_jobs was imported from {where}, not from the fresh venv ({site})")

from django.contrib.auth import get_user_model
from django.template.loader import get_template
from django.test import Client
from django.urls import reverse

from django_jobs.models import Job

names = os.environ["PACKAGE_CHECK_TEMPLATES"].split()
for name in names:
    get_template(name)

jobs = list(Job.objects.all())
unfinished = [j for j in jobs if j.state not in ("completed", "failed", "cancelled")]
if not jobs or unfinished or not any(j.state == "completed" for j in jobs):
    sys.exit(f"the demo left {[(j.task_path, j.state) for j in jobs]}")

user = get_user_model().objects.create_superuser("package-check", "package-check@example.com", None)
client = Client()
client.force_login(user)
pages = [
    reverse("admin:django_jobs_job_changelist"),
    reverse("admin:django_jobs_job_change", args=[jobs[0].pk]),
    reverse("admin:django_jobs_queuestate_changelist"),
    reverse("admin:django_jobs_queue_dashboard", args=[jobs[0].queue]),
    reverse("admin:django_jobs_schedule_add"),
]
for url in pages:
    response = client.get(url)
    if response.status_code != 200:
        sys.exit(f"GET {url}: {response.status_code}\n{response.content.decode()[:3000]}")
print(f"{len(names)} templates, {len(pages)} admin pages, {len(jobs)} demo jobs")
'
where=$(sed -n 's/^django_jobs: //p' "$log")
summary=$(tail -n 1 "$log")

echo "package: $(basename "$sdist") and $(basename "$wheel") built; twine check passed; $nfiles"
echo "package: installed in a fresh venv ($("$vpy" -c 'import sys; print(sys.version.split()[0])')); django_jobs from $where"
echo "package: example project on SQLite: migrate, demo, check, makemigrations --check; $summary: OK"
