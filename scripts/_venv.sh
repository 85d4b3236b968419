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
# The browser test (tests/test_ui.py) drives headless Chromium through
# chromedriver; both come from Debian packages, installed here when missing.
if [ "$extras" = "dev" ] && { ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; }; then
  as_root=()
  if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then as_root=(sudo); fi
  if [ "$(id -u)" = 0 ] || [ "${#as_root[@]}" -gt 0 ]; then
    echo "raftsched: installing chromium and chromium-driver for the browser test" >&2
    apt_log="$venv/apt.log"
    if ! { "${as_root[@]}" apt-get update && \
           "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
             apt-get install -y chromium chromium-driver; } >"$apt_log" 2>&1; then
      tail -n 20 "$apt_log" >&2
      echo "raftsched: could not install chromium and chromium-driver (log in $apt_log);" \
           "install those two Debian packages or tests/test_ui.py is skipped" >&2
    fi
  else
    echo "raftsched: chromium or chromedriver is missing and there is no root or sudo:" \
         "install the Debian packages chromium and chromium-driver, or tests/test_ui.py" \
         "is skipped" >&2
  fi
fi
