#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, builds, and runs the default job,
# `gpipe train`: a character-level GPT trained on /usr/share/common-licenses, pipelined over 2
# stages. Arguments go to it (see `gpipe train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
exec ./build/tools/gpipe/gpipe train "$@"
