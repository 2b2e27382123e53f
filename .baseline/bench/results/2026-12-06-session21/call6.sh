#!/usr/bin/env bash
# session 21's plan, call 6 (same tree as call5.sh, after it on the warm machine): where the
# channels-last mid stages' time goes. The phase clocks (kernels/phase_clock.cuh, first run for
# channels-last) of the kept (default) and streamed (NORMJIT_SPLIT=l2) forwards and the
# backwards, and of the deep (2,320,8^3) pair (its backward is the one deep kernel above 5 us);
# then Nsight Compute on the (2,256,16^3) forward kept and streamed (14.1 against 11.5 us in
# session 21 with the same chunks); then the deep rows' peers by kernel time.
S="2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 2,320,8,8,8"
for mode in auto l2; do
  env $( [ $mode = l2 ] && echo NORMJIT_SPLIT=l2 ) timeout 90 python3 bench/phase_clocks.py --layouts ndhwc \
    --shapes $S > $OUT/phase_$mode.log 2>&1
  echo "== $mode"; python3 bench/phase_clocks.py --summarize $OUT/phase_$mode.log
done
for mode in resident l2; do
  NORMJIT_SPLIT=$mode OUT=$OUT/prof_$mode timeout 55 bench/ncu_source.sh --shapes 2,256,16,16,16 --layouts ndhwc \
    > $OUT/prof_$mode.log 2>&1
  grep -E "nhwc_forward|Duration|Elapsed Cycles|Registers|Achieved Occupancy|Warp Cycles Per Issued" $OUT/prof_$mode/details.txt | head -8
done
# The deep rows' peers by kernel time (bench_instance_norm --kernel-times, first GPU run):
# normjit against torch.compile and eager without the event-to-kernel gap.
timeout 150 python3 bench/bench_instance_norm.py --dtypes fp16 --layouts ncdhw,ndhwc --modes fwd \
  --shapes 2,320,8,8,8 2,320,4,4,4 --kernel-times --no-plot --out $OUT/deep_peers > $OUT/deep_peers.log 2>&1
sed -n '/GPU time per call by CUPTI/,$p' $OUT/deep_peers/results.md | head -12 || tail -20 $OUT/deep_peers.log
