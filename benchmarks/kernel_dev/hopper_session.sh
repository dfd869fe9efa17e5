#!/usr/bin/env bash
# One device call of Hopper kernel development: the prebuilt kernels under .dev/hopper (hopper_build.py) checked and
# timed on the GPU (hopper_dev.py), each in its own process under a timeout (a deadlocked kernel costs one slot,
# not the call, and the other kernels of its schedule, the name's prefix before "_", are skipped). Run from the repo
# root with carry [".whl", ".dev/hopper"].
#   KERNELS="name ..."   these, in this order (default: every kernel under .dev/hopper)
#   FULL="name ..."      also the harness's whole verification on those kernels
#   BASELINES="prefix"   kernels whose name starts with it are timed beside cuDNN and FLASH (default: all)
#   BENCH=0              no timing
#   NCU="name ..."       then one Nsight Compute --set full profile of each (N=$NCU_N, default 4096), with cuDNN
#   SANITIZE="name ..."  then compute-sanitizer racecheck and synccheck on each (sanitize_one.py)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
log=$OUT/hopper-dev.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)" | tee -a "$log"
mkdir -p /tmp/res
deadlocked=" "
for d in ${KERNELS:-.dev/hopper/*/}; do
  name=$(basename "$d")
  d=.dev/hopper/$name
  sched=${name%%_*}
  case "$deadlocked" in *" $sched "*) echo "$name: skipped (schedule $sched timed out before)" | tee -a "$log"; continue;; esac
  flags=""
  [ "${BENCH:-1}" = 1 ] && flags="--bench"
  case "$name" in "${BASELINES:-}"*) ;; *) flags="$flags --no-baselines";; esac
  case " ${FULL:-} " in *" $name "*) flags="$flags --full";; esac
  timeout "${KTIMEOUT:-150}" python3 benchmarks/kernel_dev/hopper_dev.py "$d" $flags --out "/tmp/res/$name.json" 2>&1 | tee -a "$log"
  if [ "${PIPESTATUS[0]}" = 124 ]; then echo "$name: TIMEOUT (deadlock?)" | tee -a "$log"; deadlocked="$deadlocked$sched "; fi
done
python3 -c "
import json, glob, os
out = {}
for f in sorted(glob.glob('/tmp/res/*.json')):
    out.update(json.load(open(f)))
json.dump(out, open(os.environ['OUT'] + '/hopper-dev.json', 'w'), indent=1)
"
for name in ${NCU:-}; do
  timeout 200 ncu --set full --clock-control none --import-source yes -k regex:'fg_|cudnn|sdpa|fmha' -o "$OUT/ncu-$name" \
    python3 benchmarks/kernel_dev/ncu_dev.py ".dev/hopper/$name" --n "${NCU_N:-4096}" --cudnn > "$OUT/ncu-$name.txt" 2>&1
  ncu -i "$OUT/ncu-$name.ncu-rep" --page details --print-details all > "$OUT/ncu-$name-details.txt" 2>&1
  ncu -i "$OUT/ncu-$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$name-source.csv" 2>&1
  echo "ncu $name: $(wc -c < "$OUT/ncu-$name-details.txt") bytes of details" | tee -a "$log"
done
for name in ${SANITIZE:-}; do
  for tool in racecheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool python3 benchmarks/kernel_dev/sanitize_one.py ".dev/hopper/$name" 2>&1 \
      | tail -4 | sed "s/^/$tool $name: /" | tee -a "$log"
  done
done
