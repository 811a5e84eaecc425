# Sourced by scripts/test.sh: stages timed as they end, and jobs run in the background while the
# CPU compiles (downloads, Go builds, image builds), each awaited where it is first needed.
#
#   stage NAME "what it does"   ends the running stage (printing its wall time) and starts NAME
#   background NAME CMD...       runs CMD in the background, its output kept in a log
#   await NAME                   waits for NAME; on failure prints its log and exits
#   stage_report                 ends the running stage and prints every stage's and job's time
#
# Beside each stage's wall time, how busy the CPUs were (all cores, everything on the machine,
# background jobs included): a stage far below 100 % waits on something else (the network, a
# sandbox's timer) and leaves room to run work beside it.
# The report is printed at exit, failed runs included (test.sh traps EXIT), so that every run's
# log ends with where its time went.

stage_names=()
stage_secs=()
stage_cpus=()
stage_current=""
stage_began=0
stages_began=$(date +%s)
declare -A background_pids=() background_began=() background_waited=()
background_order=()
background_dir="$(mktemp -d)"

# Busy and total CPU time since boot, in clock ticks: "busy total".
cpu_ticks() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}
stage_ticks="$(cpu_ticks)"

stage_end() {
    [ -n "$stage_current" ] || return 0
    local took=$(($(date +%s) - stage_began)) now busy
    now="$(cpu_ticks)"
    busy=$(awk -v a="$stage_ticks" -v b="$now" 'BEGIN { split(a, x, " "); split(b, y, " ");
        t = y[2] - x[2]; printf "%d", (t > 0 ? 100 * (y[1] - x[1]) / t : 0) }')
    stage_names+=("$stage_current")
    stage_secs+=("$took")
    stage_cpus+=("$busy")
    echo "<== $stage_current: ${took} s, CPUs ${busy} % busy"
    stage_current=""
}

stage() {
    stage_end
    stage_current="$1"
    stage_began=$(date +%s)
    stage_ticks="$(cpu_ticks)"
    echo "==> [$1] $2"
}

background() {
    local name="$1"
    shift
    background_order+=("$name")
    background_began[$name]=$(date +%s)
    # A process group of its own (job control on for this fork only), so that a failed run can
    # stop the job with everything it started.
    set -m
    (
        "$@"
        date +%s >"$background_dir/$name.ended"
    ) >"$background_dir/$name.log" 2>&1 &
    background_pids[$name]=$!
    set +m
    echo "==> in the background: $name (log $background_dir/$name.log)"
}

await() {
    local name="$1" pid="${background_pids[$1]:-}" began
    if [ -z "$pid" ]; then
        echo "await: no background job named $name" >&2
        exit 1
    fi
    [ -n "${background_waited[$name]:-}" ] && return 0
    began=$(date +%s)
    if ! wait "$pid"; then
        echo "the background job $name failed; its output:" >&2
        cat "$background_dir/$name.log" >&2
        background_waited[$name]=failed
        exit 1
    fi
    background_waited[$name]=$(($(date +%s) - began))
    if [ -s "$background_dir/$name.log" ]; then
        sed "s/^/[$name] /" "$background_dir/$name.log"
    fi
}

stage_report() {
    local status=$?
    stage_end
    local total=$(($(date +%s) - stages_began)) i name ended took
    echo
    echo "==> where the time went (wall clock, seconds)"
    printf '%-28s %8s %10s\n' "stage" "seconds" "CPU busy"
    for i in "${!stage_names[@]}"; do
        printf '%-28s %8s %9s%%\n' "${stage_names[$i]}" "${stage_secs[$i]}" "${stage_cpus[$i]}"
    done
    printf '%-28s %8s\n' "total" "$total"
    if [ ${#background_order[@]} -gt 0 ]; then
        echo "background jobs (they ran beside the stages above; 'waited' is what the stages waited for them):"
        printf '%-28s %8s %8s\n' "job" "seconds" "waited"
        for name in "${background_order[@]}"; do
            took="running"
            if [ -f "$background_dir/$name.ended" ]; then
                ended=$(cat "$background_dir/$name.ended")
                took=$((ended - background_began[$name]))
            fi
            printf '%-28s %8s %8s\n' "$name" "$took" "${background_waited[$name]:--}"
        done
        # A job made of stages of its own (test.sh's second lane) printed them as it went.
        for name in "${background_order[@]}"; do
            if grep -q '^<== ' "$background_dir/$name.log" 2>/dev/null; then
                echo "stages of the background job $name:"
                sed -n 's/^<== \([^:]*\): \([0-9]*\) s, CPUs \([0-9]*\) % busy$/\1 \2 \3/p' \
                    "$background_dir/$name.log" | while read -r stage_name secs busy; do
                    printf '  %-26s %8s %9s%%\n' "$stage_name" "$secs" "$busy"
                done
            fi
        done
    fi
    # Jobs nobody waited for (a failed run) must not outlive it.
    for name in "${background_order[@]}"; do
        kill -- "-${background_pids[$name]}" 2>/dev/null || true
    done
    rm -rf "$background_dir"
    return "$status"
}
