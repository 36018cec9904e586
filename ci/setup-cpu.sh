#!/usr/bin/env bash
# Fresh-machine set-up for CPU ranks: a virtual environment in .venv with the CPU build of torch
# (pinned: an unpinned torch pulls a multi-GB CUDA build) and this project with its test tools
# and LitGPT (whose own pin, torch>=2.7, keeps the torch installed first), and matplotlib for
# the charts.
# Safe to run again: pip skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[test,litgpt,plot]"
# On its own, after the rest: LitGPT 0.5.13 pins huggingface-hub<1.4 while transformers>=5.17
# needs >=1.5, so one resolve of both fails; LitGPT's model code the tests use never calls the
# hub. pip reports the pin it leaves unmet and goes on.
.venv/bin/python -m pip install -q -e ".[hf]"
