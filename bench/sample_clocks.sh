#!/usr/bin/env bash
# Samples the GPU's SM and memory clocks, power, temperature and throttle reasons once a second
# into FILE (nvidia-smi's CSV with a header) until killed: the record beside an A/B that shows
# whether a slow timing ran at a lower clock (benchlib.gpu_clocks reads the same fields once, right
# after each timing). Usage, from a device-call script:
#   bench/sample_clocks.sh "$OUT/clocks.csv" & sampler=$!   ...   kill $sampler
exec nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 1000 > "${1:?usage: bench/sample_clocks.sh FILE}" 2>&1
