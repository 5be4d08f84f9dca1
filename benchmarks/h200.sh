#!/usr/bin/env bash
# One call on the lent H200 (torch + triton only there): install cleave's wheel,
# time every prebuilt plan against the baselines, replay the serving traces.
# Inputs travel with the call: .whl/ (cleave + platformdirs wheels), the plans
# (python -m benchmarks.build) and the artifacts (cleave trace build), one NAME.cleave
# per trace: traces/workloads/NAME.jsonl, or a paged definition's
# traces/paged/workloads/NAME.jsonl (regenerated here by traces/simulate_paged.py).
# Usage there: bash benchmarks/h200.sh [SECONDS_FOR_THE_PLAN_BENCHMARK] [SECONDS_PER_TRACE]
# (0 seconds skips that part: the device's 10-minute limit per call may need two calls);
# PLANS and ARTIFACTS name other directories than .gpu_plans and .gpu_artifacts;
# TRACE_LIMIT replays only each trace's first steps; SKIP adds baseline name patterns
# to leave out of the plan benchmark (the list in the table says which were).
set -u
repo=$(pwd)
out=${OUT:-/tmp/cleave_out}
plans=$repo/${PLANS:-.gpu_plans}
artifacts=$repo/${ARTIFACTS:-.gpu_artifacts}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$repo"/.whl/*.whl 2>/dev/null
# Run from /tmp so that the checkout's cleave/ (without cleave.scheduler) does not shadow the wheel.
export PYTHONPATH=/tmp/site:$repo PYTHONUNBUFFERED=1
cd /tmp
read -ra skip <<< "${SKIP:-}"  # words, not globbed: fnmatch patterns such as *flex_attention
if [ "${1:-380}" != 0 ] && [ -d "$plans" ]; then
    timeout "${1:-380}" python3 -m benchmarks.run --plans "$plans" --out "$out" --skip "torch.compile max-autotune" "${skip[@]}" \
        > "$out/table.md" 2> "$out/run.log"
    echo "benchmarks.run exit $?"
fi
if [ "${2:-200}" != 0 ] && [ -d "$artifacts" ]; then
    for dir in "$artifacts"/*.cleave; do
        trace=$(basename "$dir" .cleave)
        file=$repo/traces/workloads/$trace.jsonl
        if [ ! -f "$file" ]; then
            file=$repo/traces/paged/workloads/$trace.jsonl
            [ -f "$file" ] || python3 "$repo/traces/simulate_paged.py" --seed 0 --out "$repo/traces/paged" > /dev/null
        fi
        if [ -f "$repo/traces/workloads/$trace.jsonl" ]; then
            timeout "${2:-200}" python3 -m cleave.cli.main trace replay "$file" --device cuda --artifact "$dir" \
                ${TRACE_LIMIT:+--limit "$TRACE_LIMIT"} > "$out/replay_$trace.txt" 2>&1
        else  # a paged trace: against padded SDPA per step too (benchmarks/replay_paged.py)
            timeout "${2:-200}" python3 -m benchmarks.replay_paged "$file" --artifact "$dir" \
                ${TRACE_LIMIT:+--limit "$TRACE_LIMIT"} > "$out/replay_$trace.txt" 2>&1
        fi
        echo "replay $trace exit $?"
        tail -n 3 "$out/replay_$trace.txt"
        # The per-bucket rankings the replay profiled, for the record (flat names: the
        # device tool brings back shallow paths only).
        i=0
        for f in $(find "$dir" -name tuning.json); do
            cp "$f" "$out/tuning_${trace}_$i.json"; i=$((i + 1))
        done
    done
fi
[ -f "$out/run.log" ] && grep -E "FAIL" "$out/run.log" | head -20
[ -f "$out/table.md" ] && cat "$out/table.md"
true
