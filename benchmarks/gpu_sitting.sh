#!/usr/bin/env bash
# The prepared GPU sitting, in the order docs/gpu.md gives: where a stacked step's time goes,
# the stacked step measured on both paths, the campaign's GPU prices measured again with the
# executor as it is now, then whole tables in the plan's order for what is left of the budget.
#
#   FEDHET_COMMIT=<commit> bash benchmarks/gpu_sitting.sh "$OUT" MINUTES [DEVICE]
#
# Run from the checkout on the lent machine, MNIST carried in the git-ignored data/mnist/, and
# the project's profiling script copied to tools/gpu_step_profile.py beforehand (it lives in
# shared/tools/, outside the checkout; skipped with a line when absent). DEVICE defaults to
# cuda; `cpu` is the dry run (small step counts, no re-measurement, no campaign minutes, the
# campaign's records copied to a temporary folder first so the checkout's stay untouched).
# Everything it writes goes under OUT: step.md, rings.md, server.md, conv.md, devcheck.txt, results.tar.gz, removed.txt,
# paper-scale.md, sitting.log.
set -u
out=${1:?usage: gpu_sitting.sh OUT MINUTES [DEVICE]}
minutes=${2:?usage: gpu_sitting.sh OUT MINUTES [DEVICE]}
device=${3:-cuda}
mkdir -p "$out"
export PYTHONPATH=src
py=${PYTHON:-python}  # the dry run here: PYTHON=.venv/bin/python
start=$(date +%s)
if [ "$device" = cpu ]; then steps="--steps 5 --repeats 1 --rows 1,4"; remeasure=""; else
  steps="--steps 50 --repeats 5 --rows 1,8,32,100"; remeasure="--remeasure"; fi
if [ -f tools/gpu_step_profile.py ]; then
  timeout 200 "$py" tools/gpu_step_profile.py --out "$out" --device "$device" > "$out/profile.log" 2>&1 \
    || echo "profile: exit $? (see profile.log)"
else
  echo "profile: tools/gpu_step_profile.py not here (copy it from shared/tools/ before the call)"
fi
# shellcheck disable=SC2086
timeout 240 "$py" benchmarks/bench_step.py --device "$device" $steps > "$out/step.md" 2>"$out/step.err" \
  || echo "bench_step: exit $? (see step.err)"
cat "$out/step.md"
if [ "$device" = cpu ]; then rings="--algorithms fedsr --modes chains --repeats 1"; else
  rings="--algorithms ring,fedsr --modes chains,chains-eager --repeats 1"; fi
# shellcheck disable=SC2086
timeout 100 "$py" benchmarks/bench_rings.py --device "$device" --data-dir data $rings \
  > "$out/rings.md" 2>&1 || echo "bench_rings: exit $? (see rings.md)"
[ "$device" = cpu ] || timeout 60 "$py" benchmarks/bench_rings.py --device "$device" --data-dir data \
  --algorithms ring --runs 8 --modes chains --repeats 1 >> "$out/rings.md" 2>&1 \
  || echo "bench_rings (8 runs): exit $? (see rings.md)"
cat "$out/rings.md"
timeout 60 "$py" benchmarks/bench_server.py --device "$device" --repeats 3 > "$out/server.md" 2>&1 \
  || echo "bench_server: exit $? (see server.md)"
cat "$out/server.md"
if [ "$device" = cpu ]; then convrows="--rows 1 --repeats 1"; else convrows="--rows 1,8,32,100"; fi
# shellcheck disable=SC2086
timeout 90 "$py" benchmarks/bench_conv.py --device "$device" $convrows > "$out/conv.md" 2>&1 \
  || echo "bench_conv: exit $? (see conv.md)"
cat "$out/conv.md"
used=$(( ($(date +%s) - start) / 60 ))
left=$(python3 -c "print(max(0.5, $minutes - $used))")
records=results
if [ "$device" = cpu ]; then  # the dry run works on a copy: the checkout's records stay as they are
  records=$(mktemp -d)/results && cp -r results "$records"; fi
# shellcheck disable=SC2086
"$py" benchmarks/gpu_campaign.py --out "$out" --minutes "$left" --device "$device" $remeasure \
  --data-dir data --results "$records" 2>&1 | tee "$out/sitting.log" | tail -40
[ "$device" = cpu ] && rm -rf "$(dirname "$records")"
