#!/usr/bin/env bash
# The wheels a GPU machine needs for bench/gpu/ and the GPU tests (it has no network), into the
# git-ignored .whl/: the shared preparation plus what this project's server imports beyond it.
#     bash bench/gpu/prepare.sh        # here, once; then carry [".whl"] and run bench/gpu/run.sh
# (2026-11-27: a session that ran ../shared/gpu/prepare.sh alone lost a call to the missing
# swagger-ui-bundle-v2.)
set -euo pipefail
[ -f pyproject.toml ] || { echo "run this from the project root" >&2; exit 2; }
exec bash ../shared/gpu/prepare.sh swagger-ui-bundle-v2 "$@"
