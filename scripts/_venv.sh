# Sourced by scripts/run and scripts/test: make ./.venv if missing and install
# the project into it when pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
extras="${1:-}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "raftsched: creating $venv" >&2
  "$py" -m venv "$venv"
fi
stamp="$venv/.raftsched-installed${extras:+-$extras}"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "raftsched: installing the project into $venv${extras:+ (with $extras)}" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root${extras:+[$extras]}"
  touch "$stamp"
fi
