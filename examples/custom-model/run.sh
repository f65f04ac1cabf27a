#!/usr/bin/env bash
# Runs the custom-model example (your own model and data: model.py): the README's commands, each
# party in the background, then one JSON line (rounds, accuracy, epsilon). The steps are in
# ../run-example.sh, shared by every example: spgc from SPGC=/path/to/spgc, else PATH, else
# the checkout's .venv; SPGC_PORT_BASE=N moves the daemons' ports (N+1, N+2, N+11, N+21, N+22).
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run-example.sh" "$(dirname "${BASH_SOURCE[0]}")"
