#!/usr/bin/env bash
# Runs the localhost example (the cancer data set, built-in model): the README's commands, each
# party in the background, then one JSON line (rounds, accuracy, epsilon). The steps are in
# ../run-example.sh, shared by every example. SPGC=/path/to/spgc picks an installation.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run-example.sh" "$(dirname "${BASH_SOURCE[0]}")"
