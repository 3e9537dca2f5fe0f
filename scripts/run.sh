#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, builds, and runs the default job, a
# classifier trained with GPipe over 4 partitions. Arguments go to the job (see --help there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
exec ./build/examples/train_pipeline "$@"
