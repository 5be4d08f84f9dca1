#!/usr/bin/env bash
# One call on the lent H200 (torch + triton only there): install cleave's wheel,
# time every prebuilt plan against the baselines, replay the serving traces.
# Inputs travel with the call: .whl/ (cleave + platformdirs wheels),
# .gpu_plans/ (python -m benchmarks.build) and .gpu_artifacts/ (cleave trace build).
# Usage there: bash benchmarks/h200.sh [SECONDS_FOR_THE_PLAN_BENCHMARK] [SECONDS_PER_TRACE]
# (0 seconds skips that part: the device's 10-minute limit per call may need two calls).
set -u
repo=$(pwd)
out=${OUT:-/tmp/cleave_out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$repo"/.whl/*.whl 2>/dev/null
# Run from /tmp so that the checkout's cleave/ (without cleave.scheduler) does not shadow the wheel.
export PYTHONPATH=/tmp/site:$repo PYTHONUNBUFFERED=1
cd /tmp
if [ "${1:-380}" != 0 ]; then
    timeout "${1:-380}" python3 -m benchmarks.run --plans "$repo/.gpu_plans" --out "$out" \
        > "$out/table.md" 2> "$out/run.log"
    echo "benchmarks.run exit $?"
fi
for trace in gqa_decode gqa; do
    if [ "${2:-200}" != 0 ] && [ -d "$repo/.gpu_artifacts/$trace.cleave" ]; then
        timeout "${2:-200}" python3 -m cleave.cli.main trace replay "$repo/traces/workloads/$trace.jsonl" \
            --device cuda --artifact "$repo/.gpu_artifacts/$trace.cleave" > "$out/replay_$trace.txt" 2>&1
        echo "replay $trace exit $?"
        tail -n 6 "$out/replay_$trace.txt"
        # The per-bucket rankings the replay profiled, for the record (flat names: the
        # device tool brings back shallow paths only).
        i=0
        for f in $(find "$repo/.gpu_artifacts/$trace.cleave" -name tuning.json); do
            cp "$f" "$out/tuning_${trace}_$i.json"; i=$((i + 1))
        done
    fi
done
[ -f "$out/run.log" ] && grep -E "FAIL" "$out/run.log" | head -20
[ -f "$out/bench.md" ] && cat "$out/bench.md"
true
