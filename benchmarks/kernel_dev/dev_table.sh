#!/usr/bin/env bash
# The TF/s table of hopper_session.sh logs: one line per kernel, in run order, its TF/s at each N it was timed at
# (hopper_dev.py's "  N= ... ours X" lines).   bash benchmarks/kernel_dev/dev_table.sh LOG ...
grep -hE "^[A-Za-z]+_|N=" "$@" | sed 's/ cudnn.*//' | awk '
  /_bf16_|_fp16_/ { if (line) print line; split($0, a, ":"); line = a[1]; next }
  /N=/ { line = line " " $NF }
  END { if (line) print line }'
