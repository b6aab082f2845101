#!/usr/bin/env bash
# Session 23 call 2 (from the repository root on the device; dist_s23 = the wheels of main 3cb7b00):
bash bench/reliability_rest.sh dist_s23 2>&1 | tail -60; nvidia-smi --query-gpu=name --format=csv,noheader
