#!/bin/bash
# The GPU checks of one lent session, batched into one call (docs/PERFORMANCE.md "On a GPU"): the timed parts
# alone (ours against the peer, fp8), then `pytest -m gpu` beside the 2B/3B memory plan, which time nothing.
#   bash benchmarks/gpu_session.sh PEER_SCRIPT OUT_DIR [SFT_DATA_DIR]
# PEER_SCRIPT: ../shared/peers/hf_peer_step.py (copied into the repository when the machine gets the repository
# alone); SFT_DATA_DIR: a `burnout sft` run's data/ for the packed-against-padded steps.
set -u
peer=$1 out=$2 sft_data=${3:-}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
echo "== timed: ours against the peer, fp8 $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 340 python3 -m benchmarks.bench_gpu --steps 10 --fp8 --peer "$peer" --json "$out/bench.json" 2>&1 \
    | tee "$out/bench.log"
if [ -n "$sft_data" ]; then
    timeout 230 python3 -m benchmarks.bench_gpu --shapes --steps 20 --packing "$sft_data" --json "$out/packing.json" \
        2>&1 | tee "$out/packing.log"
fi
echo "== untimed: pytest -m gpu beside the memory plan $(date +%T)"
timeout 215 python3 -m pytest -m gpu tests/gpu -v -p no:cacheprovider -k "not out_of_gpu_memory" \
    > "$out/pytest.log" 2>&1 &
timeout 215 python3 -m benchmarks.bench_gpu --shapes --memory llama-2b llama-3b --json "$out/memory.json" \
    > "$out/memory.log" 2>&1 &
wait
cat "$out/memory.log"
tail -25 "$out/pytest.log"
