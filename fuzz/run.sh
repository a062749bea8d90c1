#!/usr/bin/env bash
# Runs every fuzz target for SECONDS seconds (default 60), one after another,
# each on one core (libFuzzer `-jobs=1 -workers=1`), and prints the
# executions per target. Usage: fuzz/run.sh [SECONDS] (docs/fuzzing.md).
#
# Each target reads its committed seeds (fuzz/seeds/<target>/) and its
# working corpus (fuzz/corpus/<target>/, ignored by git), where libFuzzer
# keeps the inputs that found new coverage, so a later run goes on from
# there. Crashes land in fuzz/artifacts/<target>/, the libFuzzer logs in
# fuzz/logs/<target>.log.
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# FUZZ_TARGETS="frame connect" picks targets; FUZZ_SANITIZER=none builds
# without AddressSanitizer (faster; the code under test is safe Rust);
# FUZZ_RUNS=10000000 stops each target after that many executions instead
# of after SECONDS.
set -uo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz="$root/fuzz"
targets=${FUZZ_TARGETS:-frame connect method_params store_request}
sanitizer=${FUZZ_SANITIZER:-address}
limit=("-max_total_time=$seconds")
[ -n "${FUZZ_RUNS:-}" ] && limit=("-runs=$FUZZ_RUNS")
flags=(--fuzz-dir "$fuzz" --sanitizer "$sanitizer")

cd "$root"
cargo +nightly fuzz build "${flags[@]}" || exit 1

mkdir -p "$fuzz/logs"
status=0
summary=()
for target in $targets; do
    corpus="$fuzz/corpus/$target"
    mkdir -p "$corpus" "$fuzz/artifacts/$target"
    dict=()
    [ -f "$fuzz/dicts/$target.dict" ] && dict=("-dict=$fuzz/dicts/$target.dict")
    log="$fuzz/logs/$target.log"
    echo "== $target: ${limit[*]}"
    # With -jobs, libFuzzer writes the job's output to fuzz-0.log in the
    # current directory: run from the logs folder.
    (
        cd "$fuzz/logs" && rm -f fuzz-0.log &&
            cargo +nightly fuzz run "${flags[@]}" "$target" "$corpus" "$fuzz/seeds/$target" -- \
                "${limit[@]}" -print_final_stats=1 -jobs=1 -workers=1 \
                -timeout=30 -rss_limit_mb=4096 "${dict[@]}"
    )
    rc=$?
    mv -f "$fuzz/logs/fuzz-0.log" "$log" 2>/dev/null
    stat() { grep -a "^stat::$1:" "$log" | tail -n1 | awk '{print $2}'; }
    execs=$(stat number_of_executed_units)
    rate=$(stat average_exec_per_sec)
    added=$(stat new_units_added)
    rss=$(stat peak_rss_mb)
    if [ "$rc" -ne 0 ] || grep -aq "^==.*ERROR: libFuzzer\|panicked at" "$log"; then
        status=1
        verdict="CRASH (see $log and fuzz/artifacts/$target/)"
    else
        verdict=ok
    fi
    summary+=("$(printf '%-14s %12s execs %8s exec/s %6s new units %6s MB  %s' \
        "$target" "${execs:-?}" "${rate:-?}" "${added:-?}" "${rss:-?}" "$verdict")")
done

echo
echo "executions per target (${limit[*]} each):"
printf '%s\n' "${summary[@]}"
exit "$status"
