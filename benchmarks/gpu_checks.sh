#!/usr/bin/env bash
# The GPU figures of benchmarks/RESULTS.md, in one run on a machine with one GPU:
#   1. GeL's FEMNIST CNN at 1,000 clients a round against FedJAX on the same GPU (vs_fedjax.py),
#   2. the LEAF Synthetic round against the batched limit (round_throughput.py), again with the
#      fused small products of core/backend/small_dots.py (CPU only by default: do they pay on a GPU?)
#      and again with XLA's loops captured as CUDA graphs (is the round launch-bound?), and
#      against the naive vmap round (vs_naive_vmap.py),
#   3. where the CNN round's (with the patches convolution, then XLA's) and the Synthetic
#      round's time goes: their GPU kernels ranked (profile_round.py),
#   4. heterogeneous budgets tau_i ~ U{1..50} against equal ones at the largest Synthetic cohort
#      (heterogeneous_budgets.py), with the planner's chunk and a static trip count, then the
#      same chunks with the data-dependent loop: what that loop costs on the GPU.
# About 5 minutes on an H100, estimated from its steps' times on 2026-11-26 (this version of
# the script has not run there whole).
#
# Usage, from the repository root: bash benchmarks/gpu_checks.sh [OUT_DIR]
# Each step's table goes to OUT_DIR (default gpu_checks/) as a .md file, its rows as .json, its
# results (common.write_results) to OUT_DIR/results/ (the CUDA-graph run's to
# OUT_DIR/results/graphs/), and the machine (nvidia-smi, versions) to machine.txt. Copy the
# results wanted into benchmarks/results/ and run python benchmarks/results_md.py. A failing step is reported and the next one
# runs; the exit status counts the failed steps. The sizes can be made smaller for a dry run on
# CPU: CNN_CLIENTS=20 SYNTHETIC_CLIENTS=200 bash benchmarks/gpu_checks.sh /tmp/dry (there the
# profile with XLA's convolution takes minutes: STEP_TIMEOUT=60 cuts it)
# (SYNTHETIC_CLIENTS lists cohorts, default 200,2000,10000: steps 3-4 take the largest).
# Each step is stopped after STEP_TIMEOUT seconds (default 600).
#
# Needs JAX with the GPU's plugin, flax and optax (fedjax_gel itself is read from this checkout,
# no install). FedJAX (step 1's other side) is fedjax 0.0.17 with dm-haiku, jmp and tabulate;
# on a machine without a package index, put their wheels in .whl/ (pip download fedjax==0.0.17
# dm-haiku==0.0.17 jmp tabulate --no-deps -d .whl) and set WHEELS=.whl: they are installed into
# a temporary folder first. Without FedJAX step 1 stops with one line and the other steps still run.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_checks}
cnn=${CNN_CLIENTS:-1000}
synthetic=${SYNTHETIC_CLIENTS:-200,2000,10000}
largest=$(tr , '\n' <<<"$synthetic" | sort -n | tail -1)
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$WHEELS"/*.whl && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  "$python" -c 'import jax, flax, optax; print("jax", jax.__version__, "flax", flax.__version__,
"optax", optax.__version__, jax.devices())'
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

failed=0
# CUDA graphs for XLA's loops too (its default leaves WHILE and CONDITIONAL out)
GRAPHS=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL
step() {   # step NAME COMMAND...: runs it, its output to NAME.md, notes a failure
  local name=$1
  shift
  echo "== $name: $*"
  local start=$SECONDS
  if ! timeout "${STEP_TIMEOUT:-600}" "$@" 2>&1 | tee "$out/$name.md"; then
    echo "== $name FAILED"
    failed=$((failed + 1))
  fi
  echo "== $name: $((SECONDS - start)) s"
}

step vs_fedjax_cnn "$python" benchmarks/vs_fedjax.py --workload cnn --cohorts "$cnn" --repeats 3 \
  --json "$out/vs_fedjax_cnn.json" --results_dir "$out/results"
step round_throughput "$python" benchmarks/round_throughput.py --cohorts "$synthetic" \
  --repeats 10 --json "$out/round_throughput.json" --results_dir "$out/results"
step round_fused "$python" benchmarks/round_throughput.py --cohorts "$synthetic" \
  --repeats 10 --fuse_dots true --json "$out/round_fused.json" --results_dir "$out/results"
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=$GRAPHS" \
  step round_graphs "$python" benchmarks/round_throughput.py --cohorts "$synthetic" \
  --repeats 10 --json "$out/round_graphs.json" --results_dir "$out/results/graphs"
step vs_naive "$python" benchmarks/vs_naive_vmap.py --cohorts "$synthetic" --repeats 10 \
  --json "$out/vs_naive.json" --results_dir "$out/results"
step profile_cnn "$python" benchmarks/profile_round.py --workload cnn --clients "$cnn" \
  --rounds 3 --top 25 --results_dir "$out/results"
step profile_cnn_xla "$python" benchmarks/profile_round.py --workload cnn --clients "$cnn" \
  --rounds 3 --top 10 --xla_layers --results_dir "$out/results"
step profile_synthetic "$python" benchmarks/profile_round.py --workload synthetic \
  --clients "$largest" --rounds 10 --top 15 --results_dir "$out/results"
step heterogeneous "$python" benchmarks/heterogeneous_budgets.py --cohort "$largest" \
  --chunk_sizes "0,$((largest / 4))" --repeats 5 --results_dir "$out/results"
step heterogeneous_dynamic "$python" benchmarks/heterogeneous_budgets.py --cohort "$largest" \
  --chunk_sizes "0,$((largest / 4))" --repeats 5 --static_steps false \
  --results_dir "$out/results"
exit "$failed"
