#!/bin/bash
# The GPU checks of one lent session, batched into one call (docs/PERFORMANCE.md "On a GPU"): the timed steps
# alone (ours against the peer, fp8 against bf16), then, beside each other, what times nothing: `pytest -m gpu`,
# the bf16/fp8 loss curves (tensorwise and rowwise), and with GSM8K_DIR, GSM8K through pretraining, SFT and RL
# (bench_rl --task gsm8k, which needs more than the 5 minutes it is given here: a session of its own).
#   bash benchmarks/gpu_session.sh OUT CURVE_DATA [GSM8K_DIR]
# The peer is benchmarks/peer_step.py (transformers' model, our step's settings). CURVE_DATA: a `burnout data
# prepare … --tokenizer gpt2` folder; GSM8K_DIR: the folder of GSM8K's train.jsonl and test.jsonl. Every part prints
# its figures as they come, so a part cut off by its timeout keeps what finished; the figures the docs quote are
# appended to benchmarks/results.jsonl (bring it back with the logs).
set -u
out=$1 curve_data=$2 gsm8k=${3:-}
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
echo "== timed: ours against the peer, fp8 $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
timeout 300 python3 -m benchmarks.bench_gpu --steps 10 --fp8 --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
echo "== untimed, side by side: pytest -m gpu, loss curves${gsm8k:+, GSM8K} $(date +%T)"
timeout 290 python3 -m pytest -m gpu tests/gpu -v -p no:cacheprovider -k "not out_of_gpu_memory" \
    > "$out/pytest.log" 2>&1 &
timeout 290 python3 -m benchmarks.bench_gpu --shapes --curve "$curve_data" --fp8 tensorwise rowwise \
    --json "$out/curves.json" > "$out/curves.log" 2>&1 &
[ -n "$gsm8k" ] && timeout 290 python3 -m benchmarks.bench_rl --task gsm8k --gsm8k "$gsm8k" \
    --root /tmp/bench-rl-gsm8k --held-out 100 > "$out/gsm8k.log" 2>&1 &
wait
cp /tmp/bench-rl-gsm8k/results.json "$out/gsm8k.json" 2>/dev/null
echo "== done $(date +%T)"
tail -8 "$out/curves.log"; [ -n "$gsm8k" ] && tail -6 "$out/gsm8k.log"; tail -25 "$out/pytest.log"
