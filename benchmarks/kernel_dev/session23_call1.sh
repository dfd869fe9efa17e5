#!/usr/bin/env bash
# Prepared in session 22 for session 23's first device call, from the repo root with carry [".whl", ".dev/hopper"]
# under one deadline (BUDGET, default 540 s). Build first on the CPU (the dev cubins of session 22 predate DA):
#   python benchmarks/kernel_dev/hopper_build.py .dev/hopper cur_softcap30_bf16_d128 SC_softcap30_bf16_d128 \
#     cur_plain_bf16_d128_128x128s2 cur_alibi_bf16_d128 AL_alibi_bf16_d128 AL3_alibi_bf16_d128
# 1. The GPU tests of what session 22 changed after its device time: bench_kernels now times every kernel of a shape
#    and the baselines in the same rounds (tests/test_cheaters_gpu.py calls it with two kernels; the CPU test on a
#    fake device pins the order); the sm90 kernels with desc_plus already passed 545 GPU tests in session 22.
# 2. `flashgen bench` of cur and SC (softcap 30's constants folded) at 4k and 512, now in shared rounds: session 22
#    read SC +2.3 / +4.1 % timed after cur. Predicted +2..4 % again (SFU- and tensor-bound; the fold only removes
#    issue). If it holds, SC's production form is the lowering's (C * f(s * K), C > 0: f stored, C in the
#    softmax's multiplier), on the sm80 skeleton too.
# 3. (added in session 23) ALiBi's AL and AL3 against cur and plain, in shared rounds (hopper_build.py: ALiBi's loop
#    holds an I2FP a score, and Hopper's conversions run at 16 a cycle an SM, the SFU's rate, so ALiBi's scores may
#    take two slow-pipe ops each as softcap's do). Predicted: AL (no I2FP, one op fewer a score) +10 % or more over
#    cur if the conversions share the SFU's rate, +3..6 % if they do not; AL3 +2..4 % over AL (one op fewer again).
# 4. The rest of the GPU suite in parallel (pytest-xdist is on that image): `bash benchmarks/gpu_suite.sh -n 6`
#    (PART=1 then PART=2 in two calls), which in session 22 ran 1201 tests in ~570 s over three calls with -n 4 / 6.
set -u
export FLASHGEN_GIT_COMMIT=${FLASHGEN_GIT_COMMIT:-unknown}
. benchmarks/device_prelude.sh || exit 1
scratch /tmp/s23 "${BUDGET:-540}"
trap 'tar -czf "$OUT/call1.tgz" -C "$W" .' EXIT
timeout -k 10 "$(cap 150 200)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_cheaters_gpu.py -n 4 \
  > "$W/tests.log" 2>&1
echo "[$SECONDS s] GPU tests: exit $?"; tail -3 "$W/tests.log"
timeout -k 10 "$(cap 150 30)" python3 -m flashgen.cli bench .dev/hopper/{cur,SC}_softcap30_bf16_d128 \
  .dev/hopper/cur_plain_bf16_d128_128x128s2 --shapes "B=4,H=16,N=4096,M=4096,D=128;B=32,H=16,N=512,M=512,D=128" \
  --no-flex --min-time 0.2 --rounds 4 --out "$W/softcap.json" > "$W/softcap.log" 2>&1
echo "[$SECONDS s] softcap bench: exit $?"; grep -v -i "warn\|scaled_dot" "$W/softcap.log" | tail -24
timeout -k 10 "$(cap 150 30)" python3 -m flashgen.cli bench .dev/hopper/{cur,AL,AL3}_alibi_bf16_d128 \
  .dev/hopper/cur_plain_bf16_d128_128x128s2 --shapes "B=4,H=16,N=4096,M=4096,D=128;B=32,H=16,N=512,M=512,D=128" \
  --no-flex --min-time 0.2 --rounds 4 --out "$W/alibi.json" > "$W/alibi.log" 2>&1
echo "[$SECONDS s] alibi bench: exit $?"; grep -v -i "warn\|scaled_dot" "$W/alibi.log" | tail -30
