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
dev_stamp="$venv/.raftsched-installed-dev"
fresh() { [ -f "$1" ] && [ ! "$root/pyproject.toml" -nt "$1" ]; }
# An install with dev extras also serves the plain run.
if ! fresh "$stamp" && ! { [ -z "$extras" ] && fresh "$dev_stamp"; }; then
  echo "raftsched: installing the project into $venv${extras:+ (with $extras)}" >&2
  log="$venv/install.log"
  if ! "$venv/bin/python" -m pip install --disable-pip-version-check -e "$root${extras:+[$extras]}" \
      >"$log" 2>&1; then
    cat "$log" >&2
    echo "raftsched: installing failed (log above, also in $log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
