#!/bin/sh
# scenarios.sh NAME: one scenario of the cgroup v2 VM (tests/vm/), run by
# /init, which prints the markers around it. Each scenario makes its
# container-like cgroups (named after it: /init removes them after), runs
# drainit in them through `sandbox` (PID 1 of its own PID, mount and cgroup
# namespaces, the cgroup2 fs read-only at /sys/fs/cgroup; `-H`: the host
# view), and prints what happened as named blocks (`@@ NAME`, then lines)
# that tests/cgroup_v2.rs asserts on. It asserts nothing itself: the
# contract's expectations live in the Rust test, next to their reasons.
#
# Common blocks: status (`exited N` or `signal N`, how drainit ended), log
# (drainit's stderr), events_before / events_after (the cgroup's
# memory.events around the run), env (envrec's records: the finish
# program's and a recording worker's DRAINIT_* variables, in the order they
# ran), climb (the climber's progress), tlog (the termination message),
# kernel (the kernel's OOM lines), db (the lease worker's `status`).
set -u
name=$1
D=/tmp/$name
mkdir -p "$D"
export ENVREC_OUT=$D/env

block() { # block NAME [FILE...]: a named block of the files' lines (none when missing)
    echo "@@ $1"
    shift
    for f in "$@"; do [ -f "$f" ] && cat "$f"; done
    return 0
}

# cgroup NAME MAX OOM_GROUP: a container's cgroup as runtimes make it:
# memory.max (a size, or `max`), no swap, memory.oom.group (1: the kubelet
# since Kubernetes 1.28; 0: Docker, Podman). Prints its path.
cgroup() {
    cg=/sys/fs/cgroup/$1
    mkdir "$cg" || exit 1
    echo "$2" >"$cg/memory.max" || exit 1
    echo 0 >"$cg/memory.swap.max" || exit 1
    echo "$3" >"$cg/memory.oom.group" || exit 1
    echo "$cg"
}

# run [-H] CGROUP TAG DRAINIT_ARGS...: drainit in the sandbox, waited for;
# its stderr in $D/TAG.log, how it ended in $D/TAG.status, its pid (as the
# VM sees it) in $D/TAG.pid.
run() {
    view=
    [ "$1" = -H ] && { view=-H; shift; }
    cg=$1 tag=$2
    shift 2
    sandbox $view -p "$D/$tag.pid" -s "$D/$tag.status" "$cg" drainit "$@" >"$D/$tag.out" 2>"$D/$tag.log" </dev/null
}

# wait_file PATH [GIVE_UP]: until PATH exists, at most 20 s, or until the
# file GIVE_UP exists (the run it waits on has ended).
wait_file() {
    n=0
    while [ ! -e "$1" ] && [ ! -e "${2:-/nonexistent}" ] && [ $n -lt 200 ]; do sleep 0.1; n=$((n + 1)); done
    [ -e "$1" ]
}

# The kernel's lines about OOM kills in this scenario.
kernel() { echo "@@ kernel"; dmesg | grep -E 'oom-kill:|Killed process|Memory cgroup out of memory' || true; }

# One finished run: its status and log, the cgroup's memory.events before
# and after, the env records, the climb.
report() { # report TAG CGROUP BEFORE_FILE
    block status "$D/$1.status"
    block log "$D/$1.log"
    block events_before "$3"
    block events_after "$2/memory.events"
    block env "$D/env"
    block climb "$D/climb"
    block tlog "$D/tlog"
    kernel
}

# hostroot: this machine's root, shared read-only over 9p by tests/vm/run,
# mounted at /host (the modules loaded first, in the order tests/vm/build
# checked), with the VM's /proc, /dev and /tmp in it: `chroot /host` runs
# python3 and sees the scenario's files in /tmp at the same paths.
hostroot() {
    grep -q ' /host ' /proc/mounts && return 0
    for m in $(cat /lib/modules/order); do
        insmod "/lib/modules/$m.ko" || { echo "hostroot: insmod $m failed" >&2; return 1; }
    done
    mkdir -p /host
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /host ||
        { echo "hostroot: mount -t 9p hostroot /host failed" >&2; return 1; }
    mount -t proc proc /host/proc && mount --bind /dev /host/dev && mount --bind /tmp /host/tmp
}

LIMIT=64M

case $name in

# The sandbox itself, as drainit's worker sees it: in the container view
# (the default) /proc/self/cgroup says `0::/`, the read-only cgroup2 mount's
# root is the container's cgroup (its memory.max), and drainit is PID 1; in
# the host view (-H) the path names the cgroup under the VM's hierarchy.
sandbox_views)
    cg=$(cgroup "$name" $LIMIT 1)
    look='echo "pid1 $(cat /proc/1/comm)"; echo "cgroup $(cat /proc/self/cgroup)";
        echo "max $(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo none)";
        echo "mount $(grep " /sys/fs/cgroup " /proc/mounts)"'
    run "$cg" a -- sh -c "$look" >/dev/null
    block container "$D/a.out"
    block container_status "$D/a.status"
    run -H "$cg" b -- sh -c "$look" >/dev/null
    block host "$D/b.out"
    block host_status "$D/b.status"
    ;;

# (a) Kubernetes: memory.oom.group=1. The worker climbs past the limit; the
# kill takes drainit with it: no exit line, no finish program.
group_oom_kills_drainit)
    cg=$(cgroup "$name" $LIMIT 1)
    cp "$cg/memory.events" "$D/before"
    run "$cg" a --finish /bin/envrec -- climber 4 10 200 "$D/climb"
    report a "$cg" "$D/before"
    ;;

# (a) Docker: memory.oom.group=0. The OOM killer takes the worker alone
# (the largest process); drainit tells it was an OOM kill.
oom_kill_worker)
    cg=$(cgroup "$name" $LIMIT 0)
    cp "$cg/memory.events" "$D/before"
    : >"$D/tlog"
    run "$cg" a --finish /bin/envrec --termination-log "$D/tlog" -- climber 4 10 200 "$D/climb"
    report a "$cg" "$D/before"
    ;;

# The same from the host's view (no cgroup namespace: drainit finds its
# cgroup by /proc/self/cgroup's path), with --oom-exit-code.
oom_kill_worker_host_view)
    cg=$(cgroup "$name" $LIMIT 0)
    cp "$cg/memory.events" "$D/before"
    : >"$D/tlog"
    run -H "$cg" a --oom-exit-code 200 --finish /bin/envrec --termination-log "$D/tlog" -- \
        climber 4 10 200 "$D/climb"
    report a "$cg" "$D/before"
    ;;

# The same with drainit not PID 1 of its container (a shell is, as with a
# wrapper script or a shared process namespace): it looks at the path
# /proc/self/cgroup names first (`0::/`: none), then at the mount's root,
# and finds the container's counter there. `log` names drainit's mode.
oom_kill_worker_not_pid1)
    cg=$(cgroup "$name" $LIMIT 0)
    cp "$cg/memory.events" "$D/before"
    : >"$D/tlog"
    sandbox -p "$D/a.pid" -s "$D/a.status" "$cg" sh -c 'drainit "$@"; exit $?' sh \
        --finish /bin/envrec --termination-log "$D/tlog" -- climber 4 10 200 "$D/climb" \
        >"$D/a.out" 2>"$D/a.log" </dev/null
    report a "$cg" "$D/before"
    ;;

# The worker's child is OOM-killed; the worker survives it. On v2 the kill
# is told when it happens (memory.events wakes the wait), not at exit: the
# scenario looks for the `oom_kill` line while the worker still runs, then
# stops drainit (the worker exits 3 on SIGTERM).
oom_kill_workers_child)
    cg=$(cgroup "$name" $LIMIT 0)
    cp "$cg/memory.events" "$D/before"
    run "$cg" a --finish /bin/envrec -- sh -c '
        climber 4 10 200 "$1"; echo "child $?" >"$1.child"
        trap "exit 3" TERM
        while :; do sleep 0.1; done' sh "$D/climb" &
    launcher=$!
    told=no
    if wait_file "$D/climb.child" "$D/a.status"; then
        n=0
        while [ $n -lt 100 ] && ! grep -q 'event=oom_kill ' "$D/a.log"; do sleep 0.1; n=$((n + 1)); done
        grep -q 'event=oom_kill ' "$D/a.log" && [ ! -e "$D/a.status" ] && told=yes
    fi
    echo "@@ told_while_running"
    echo $told
    [ -e "$D/a.pid" ] && kill -TERM "$(cat "$D/a.pid")"
    wait $launcher
    report a "$cg" "$D/before"
    block child "$D/climb.child"
    ;;

# (b) Kubernetes' group kill, beaten by --memory-stop: a climb of 2 MiB
# every 20 ms to 200 MiB under a 64 MiB limit is stopped at 80%, drains,
# runs the finish program, and the OOM killer never runs.
memory_stop_climb)
    cg=$(cgroup "$name" $LIMIT 1)
    cp "$cg/memory.events" "$D/before"
    : >"$D/tlog"
    run "$cg" a --memory-stop 80 --memory-check 50ms --finish /bin/envrec --termination-log "$D/tlog" -- \
        climber 2 20 200 "$D/climb"
    report a "$cg" "$D/before"
    block limit "$cg/memory.max"
    block peak "$cg/memory.peak"
    ;;

# --memory-stop where the cgroup has no limit: memory_stop_off, the worker
# runs as usual.
memory_stop_no_limit)
    cg=$(cgroup "$name" max 1)
    run "$cg" a --memory-stop 80 -- envrec worker
    block status "$D/a.status"
    block log "$D/a.log"
    block env "$D/env"
    ;;

# (c) An idle drainit: its wakeups over $IDLE seconds, counted by the
# kernel (/proc/PID/status context switches, /proc/PID/io read calls), and
# the files it holds open (the memory source of its one wait). With
# --memory-stop the check is its one periodic wakeup.
idle | idle_memory_check)
    IDLE=3
    cg=$(cgroup "$name" $LIMIT 1)
    set --
    [ "$name" = idle_memory_check ] && set -- --memory-stop 80 --memory-check 500ms
    mkdir -p "$D/rec"
    run "$cg" a "$@" -- sigrec "$D/rec" &
    launcher=$!
    if wait_file "$D/rec/ready" "$D/a.status" && wait_file "$D/a.pid"; then
        pid=$(cat "$D/a.pid")
        sleep 0.5 # drainit's own start-up, past
        sample() {
            grep -E '^(voluntary|nonvoluntary)_ctxt_switches' "/proc/$pid/status"
            grep -E '^(syscr|syscw)' "/proc/$pid/io"
        }
        sample >"$D/before"
        sleep $IDLE
        sample >"$D/after"
        echo "@@ idle_seconds"
        echo $IDLE
        echo "@@ fds"
        for fd in /proc/"$pid"/fd/*; do echo "${fd##*/} $(readlink "$fd")"; done
        block wakeups_before "$D/before"
        block wakeups_after "$D/after"
        kill -TERM "$pid"
    fi
    wait $launcher
    block status "$D/a.status"
    block log "$D/a.log"
    ;;

# (d) --state-dir: a group OOM kill takes drainit with its worker; the next
# start with the same state directory (a new container of the same pod, the
# directory an emptyDir) sweeps up with the finish program before the worker.
state_dir_after_group_oom)
    mkdir -p "$D/state"
    cg=$(cgroup "$name" $LIMIT 1)
    cp "$cg/memory.events" "$D/before"
    run "$cg" a --state-dir "$D/state" --finish /bin/envrec -- climber 4 10 200 "$D/climb"
    block first_status "$D/a.status"
    block first_log "$D/a.log"
    block first_events_before "$D/before"
    block first_events_after "$cg/memory.events"
    cg2=$(cgroup "${name}_2" $LIMIT 1)
    run "$cg2" b --state-dir "$D/state" --finish /bin/envrec -- envrec worker
    block status "$D/b.status"
    block log "$D/b.log"
    block env "$D/env"
    kernel
    ;;

# (e) The lease worker (examples/lease-worker, python3 from this machine's
# root over 9p) under Kubernetes' group kill: at its second job the worker
# takes 512 MiB, and the OOM kill takes drainit with it. The next start with
# the same state directory (a new container of the same pod) runs the
# finish program, `release`, first: the lease freed and the job requeued
# before the worker starts, which claims the lease at once (the stale
# threshold is 30s: a backoff would show) and does every job left.
lease_worker_group_oom)
    hostroot || exit 1
    export PATH=/bin:/usr/bin # in the chroot: the machine's python3 and sh
    export LEASE_DB=$D/queue.db LEASE_HOST=vm LEASE_STALE=30s LEASE_TOKEN_FILE=$D/token
    export LEASE_HEARTBEAT=300ms LEASE_STEP=100ms LEASE_STEPS=3
    lw=$VM_REPO/examples/lease-worker
    chroot /host python3 "$lw/worker.py" init --jobs 4 2>"$D/init.log" || { cat "$D/init.log"; exit 1; }
    # drainit's --finish takes one path, which drainit sees outside the chroot.
    printf '#!/bin/sh\nexec chroot /host %s/release\n' "$lw" >"$D/release"
    chmod 0755 "$D/release"
    mkdir -p "$D/state"
    set -- --state-dir "$D/state" --finish "$D/release" --finish-timeout 60s --grace 3s \
        -- chroot /host python3 "$lw/worker.py" run
    cg=$(cgroup "$name" $LIMIT 1)
    cp "$cg/memory.events" "$D/before"
    (export LEASE_EAT_AT_JOB=2 LEASE_EAT_MIB=512 && run "$cg" a "$@")
    block first_status "$D/a.status"
    block first_log "$D/a.log"
    block first_events_before "$D/before"
    block first_events_after "$cg/memory.events"
    cg2=$(cgroup "${name}_2" $LIMIT 1)
    run "$cg2" b "$@"
    block status "$D/b.status"
    block log "$D/b.log"
    chroot /host python3 "$lw/worker.py" status >"$D/db" 2>&1
    block db "$D/db"
    kernel
    ;;

*)
    echo "scenarios.sh: no scenario named $name" >&2
    exit 2
    ;;
esac
