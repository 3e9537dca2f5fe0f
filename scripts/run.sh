#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, builds the gpipe command, and runs the
# default job, `gpipe train`: a character-level GPT trained on /usr/share/common-licenses,
# pipelined over 2 stages. Arguments go to it (see `gpipe train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh gpipe_command  # progress shows: the first build takes minutes
source scripts/libtorch.sh
exec "./$(gpipe_build_dir "$(gpipe_libtorch)")/tools/gpipe/gpipe" train "$@"
