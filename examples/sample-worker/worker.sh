#!/bin/sh
# sample-worker: a worker that drains cleanly under drainit.
#
# It works in steps. A stop signal (SIGTERM from `docker stop`, the kubelet or
# ECS, forwarded by drainit to the worker's process group) does not cut the
# current step short: the worker finishes that step, writes
# $SAMPLE_WORKER_STATE_DIR/cleanup.done, and exits 0; drainit then exits 0 too,
# well before its grace deadline. Plain POSIX sh (busybox sh, dash, bash).
#
# Environment:
#   SAMPLE_WORKER_STEP       seconds one step of work takes (default 1); the
#                            longest a stop has to wait, so keep DRAINIT_GRACE above it
#   SAMPLE_WORKER_STATE_DIR  where cleanup.done is written (default /state)
set -u

step_seconds=${SAMPLE_WORKER_STEP:-1}
state_dir=${SAMPLE_WORKER_STATE_DIR:-/state}
stopping=
step=0

# The trap only records the request. The shell runs a trap after the foreground
# command (the current step) has finished, so the step is never interrupted.
trap 'stopping=TERM' TERM
trap 'stopping=INT' INT

mkdir -p "$state_dir"
rm -f "$state_dir/cleanup.done"
echo "sample-worker: ready pid=$$ attempt=${DRAINIT_ATTEMPT:-none} step=${step_seconds}s"

while [ -z "$stopping" ]; do
    step=$((step + 1))
    # One unit of work. Its processes ignore the stop signals (drainit sends
    # them to the whole group), so it runs to its end; the shell above acts.
    (trap '' TERM INT; sleep "$step_seconds")
done

echo "sample-worker: SIG$stopping received during step $step; step finished, cleaning up"
echo "stopped by SIG$stopping after step $step" > "$state_dir/cleanup.done.tmp"
mv "$state_dir/cleanup.done.tmp" "$state_dir/cleanup.done"
echo "sample-worker: clean exit"
exit 0
