#!/usr/bin/env bash
# README quick start, command 1: install what is missing, build, and run the main job on its
# built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
bash ci/main_job.sh
