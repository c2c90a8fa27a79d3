#!/usr/bin/env python3
"""lease-worker: a task worker that keeps its queue and its lease in SQLite.

Meant to run under drainit (see README.md beside this file). Standard library only.

Subcommands:
  init    create the schema and enqueue --jobs N queued jobs
  run     the worker: take this host's lease, work jobs one at a time, drain on SIGTERM;
          with NOTIFY_SOCKET set, READY=1 once the lease is held and WATCHDOG=1 from
          the job loop, once per turn (never from the heartbeat thread)
  release free the lease this container's worker held and requeue its running jobs,
          fenced on the token in --token-file (drainit's --finish program; idempotent)
  sweep   requeue `running` jobs whose holder's lease is stale or gone (idempotent)
  status  print every job, the leases and a summary line

Every option has an environment variable (LEASE_*); a flag beats its variable.

Exit codes of `run`:
  0   queue empty, or stopped by SIGTERM/SIGINT after handing its job back
  75  (EX_TEMPFAIL) this host's lease is still fresh: a predecessor may be alive.
      The remaining time is written to $DRAINIT_RETRY_AFTER_FILE first, so drainit
      sleeps exactly that long before the next attempt (StartupBackoff).
  1   the lease was lost while running (someone else fenced us out)
  2   bad flags or environment

Exit codes of `release`: 0 whether or not there was anything to release; 1 on a
database error or a token file it cannot use (kept, so running it again retries);
2 bad flags, or not run by drainit as its finish program.
"""

import argparse
import math
import os
import re
import select
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time

PROG = "lease-worker"
EX_TEMPFAIL = 75

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id          INTEGER PRIMARY KEY,
    status      TEXT    NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'running', 'done')),
    claimed_by  TEXT,               -- holder_host of the lease under which it runs
    claimed_at  REAL,               -- unix time of the claim
    attempts    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, id);
CREATE TABLE IF NOT EXISTS leases (
    resource     TEXT    PRIMARY KEY,   -- 'worker/<host>': one lease per host
    holder_host  TEXT    NOT NULL UNIQUE,
    holder_pid   INTEGER,               -- NULL once released
    token        INTEGER NOT NULL,      -- fencing token, only ever grows
    heartbeat_at REAL    NOT NULL       -- unix time of the last heartbeat
);
-- The "side effect" of a job: one row per successful, fenced completion.
-- No UNIQUE constraint on purpose, so a double completion would show.
CREATE TABLE IF NOT EXISTS completions (
    job_id      INTEGER NOT NULL,
    holder_host TEXT    NOT NULL,
    holder_pid  INTEGER NOT NULL,
    token       INTEGER NOT NULL,
    done_at     REAL    NOT NULL
);
"""


# ---------------------------------------------------------------------------
# small helpers


def fmt(v):
    if isinstance(v, float):
        v = f"{v:.3f}"
    s = str(v)
    if s == "" or any(c in s for c in ' "='):
        s = '"' + s.replace('"', '\\"') + '"'
    return s


def log(event, **kv):
    parts = [f"event={event}"] + [f"{k}={fmt(v)}" for k, v in kv.items()]
    try:
        print(f"{PROG}: " + " ".join(parts), file=sys.stderr, flush=True)
    except (BrokenPipeError, OSError):
        pass


_DUR = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")


def parse_duration(text):
    """humantime-ish: '500ms', '2s', '1m30s', '1.5' (seconds). Returns seconds."""
    s = str(text).strip()
    if not s:
        raise ValueError("empty duration")
    total, pos = 0.0, 0
    for m in _DUR.finditer(s):
        if m.start() != pos:
            break
        n, unit = float(m.group(1)), m.group(2)
        if unit is None and m.end() != len(s):
            break
        total += n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[unit]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"bad duration {text!r} (want e.g. 500ms, 2s, 1m30s)")
    return total


def humantime(seconds):
    """A duration drainit can parse, rounded up to the millisecond."""
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def connect(path):
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


class Tx:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): takes the write lock up front."""

    def __init__(self, conn):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb):
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
        return False


class Notifier:
    """systemd's notify protocol, the sending side: one datagram per message to
    $NOTIFY_SOCKET (drainit's, with --watchdog/--ready-timeout/--ready-file; or
    systemd's). Without the variable every send is a no-op."""

    def __init__(self):
        self.addr = os.environ.get("NOTIFY_SOCKET") or None
        self.sock = None
        self._failed = False
        if self.addr is None:
            return
        if self.addr.startswith("@"):
            # An abstract socket name: '@' stands for the leading NUL byte.
            self.addr = "\0" + self.addr[1:]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        # A receiver that stops reading must not hang the job loop for good: a ping
        # that cannot go out is a missed ping, which the watchdog is there to see.
        self.sock.settimeout(1.0)

    def send(self, *assignments):
        if self.sock is None:
            return
        try:
            self.sock.sendto("\n".join(assignments).encode(), self.addr)
        except OSError as e:
            if not self._failed:
                self._failed = True
                log("notify_failed", socket=os.environ.get("NOTIFY_SOCKET"), error=str(e))


def eat(mib):
    """Take MIB MiB, 4 MiB at a time, every page written (a page only reserved is
    not charged to the container's memory cgroup): a leak, or a job too big for
    its container. Under a lower limit the kernel's OOM killer ends the process
    here, with SIGKILL: no handler runs, nothing is handed back. Returns what it
    took, to be held until the job ends."""
    held = []
    for _ in range(0, mib, 4):
        held.append(b"\x01" * (4 << 20))
    return held


def wedge_forever():
    """Block for good in a read nobody answers: a pipe whose write end we keep open.
    A signal interrupts the read, its handler only sets the shutdown token, and the
    read resumes (PEP 475): a stop signal cannot free the job loop, only SIGKILL can."""
    r, _w = os.pipe()  # plain fds: nothing closes _w behind our back
    while True:
        os.read(r, 1)


class Shutdown:
    """The shutdown token: set by a signal handler or by the heartbeat thread.

    wait(t) sleeps up to t seconds and returns early (True) once the token is set.
    A self-pipe (also the signal wakeup fd) makes the wakeup immediate.
    """

    def __init__(self):
        self.reason = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def install(self, ignore_sigterm):
        signal.set_wakeup_fd(self._w)
        if ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, _frame):
        # Only set a flag here; logging happens in the main loop.
        if self.reason is None:
            self.reason = signal.Signals(signum).name

    def trigger(self, reason):
        if self.reason is None:
            self.reason = reason
        try:
            os.write(self._w, b"x")
        except BlockingIOError:
            pass

    def is_set(self):
        return self.reason is not None

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while self.reason is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                try:
                    os.read(self._r, 512)
                except BlockingIOError:
                    pass
        return self.reason is not None


# ---------------------------------------------------------------------------
# configuration


def env(name, default=None):
    v = os.environ.get(name)
    if v is not None and v.strip() == "":
        raise SystemExit(f"{PROG}: error: {name} is set but empty")
    return v if v is not None else default


def env_flag(name):
    v = env(name, "0").lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"{PROG}: error: {name}={v!r} is not a boolean (use 1 or 0)")


def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=env("LEASE_DB", "queue.db"),
                        help="SQLite database file [LEASE_DB, default queue.db]")
    common.add_argument("--host", default=env("LEASE_HOST") or socket.gethostname(),
                        help="this worker's host name, the lease identity [LEASE_HOST, default hostname]")
    common.add_argument("--stale", default=env("LEASE_STALE", "10s"),
                        help="a lease without a heartbeat for this long is stale [LEASE_STALE, default 10s]")
    common.add_argument("--token-file", default=env("LEASE_TOKEN_FILE"),
                        help="where `run` records the token it holds and `release` reads it; private "
                             "to this container, never on a volume other containers share "
                             "[LEASE_TOKEN_FILE, default $TMPDIR/lease-worker.<host>.token]")

    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    pi = sub.add_parser("init", parents=[common], help="create the schema and enqueue jobs")
    pi.add_argument("--jobs", type=int, default=int(env("LEASE_JOBS", "10")),
                    help="how many queued jobs to add [LEASE_JOBS, default 10]")

    pr = sub.add_parser("run", parents=[common], help="run the worker")
    pr.add_argument("--heartbeat", default=env("LEASE_HEARTBEAT"),
                    help="heartbeat interval [LEASE_HEARTBEAT, default stale/4]")
    pr.add_argument("--step", default=env("LEASE_STEP", "200ms"),
                    help="duration of one work step [LEASE_STEP, default 200ms]")
    pr.add_argument("--steps", type=int, default=int(env("LEASE_STEPS", "5")),
                    help="steps per job [LEASE_STEPS, default 5]")
    pr.add_argument("--poll", default=env("LEASE_POLL", "0"),
                    help="when the queue is empty, poll this often instead of exiting 0 "
                         "[LEASE_POLL, default 0 = exit]")
    pr.add_argument("--ignore-sigterm", action="store_true", default=env_flag("LEASE_IGNORE_SIGTERM"),
                    help="misbehave: ignore SIGTERM [LEASE_IGNORE_SIGTERM=1]")
    pr.add_argument("--long-step", action="store_true", default=env_flag("LEASE_LONG_STEP"),
                    help="misbehave: do each job as one long step (step*steps) that never "
                         "checks the shutdown token [LEASE_LONG_STEP=1]")
    pr.add_argument("--wedge-at-job", type=int, default=int(env("LEASE_WEDGE_AT_JOB", "0")),
                    help="misbehave: after claiming its Nth job, block the job loop for good in "
                         "a read nobody answers, while the heartbeat thread goes on renewing "
                         "the lease (for drainit's --watchdog) [LEASE_WEDGE_AT_JOB, default 0 = never]")
    pr.add_argument("--eat-at-job", type=int, default=int(env("LEASE_EAT_AT_JOB", "0")),
                    help="misbehave: after claiming its Nth job, take --eat-mib MiB of memory "
                         "(for an OOM kill in a container with a lower limit) "
                         "[LEASE_EAT_AT_JOB, default 0 = never]")
    pr.add_argument("--eat-mib", type=int, default=int(env("LEASE_EAT_MIB", "512")),
                    help="with --eat-at-job: how many MiB, 4 MiB at a time, each byte written "
                         "[LEASE_EAT_MIB, default 512]")

    sub.add_parser("release", parents=[common],
                   help="free the lease this container's worker held (fenced on its token) and "
                        "requeue its running jobs")
    sub.add_parser("sweep", parents=[common],
                   help="requeue running jobs whose holder's lease is stale or gone")
    sub.add_parser("status", parents=[common], help="print jobs, leases and a summary")
    return p


def parse_args(argv):
    p = build_parser()
    a = p.parse_args(argv)
    try:
        a.stale = parse_duration(a.stale)
        if a.stale <= 0:
            raise ValueError("stale threshold must be > 0")
        if a.cmd == "run":
            a.step = parse_duration(a.step)
            a.poll = parse_duration(a.poll)
            a.heartbeat = parse_duration(a.heartbeat) if a.heartbeat else a.stale / 4
            if not 0 < a.heartbeat < a.stale:
                raise ValueError(f"heartbeat ({a.heartbeat}s) must be > 0 and below the stale "
                                 f"threshold ({a.stale}s)")
            if a.steps < 1:
                raise ValueError("--steps must be >= 1")
            if a.wedge_at_job < 0:
                raise ValueError("--wedge-at-job must be >= 0")
            if a.eat_at_job < 0 or a.eat_mib < 1:
                raise ValueError("--eat-at-job must be >= 0 and --eat-mib >= 1")
    except ValueError as e:
        p.error(str(e))
    if a.token_file is None:
        name = a.host.replace("/", "_")
        a.token_file = os.path.join(tempfile.gettempdir(), f"lease-worker.{name}.token")
    return a


def resource_of(host):
    return f"worker/{host}"


# ---------------------------------------------------------------------------
# init / status / sweep


def cmd_init(a):
    conn = connect(a.db)
    conn.executescript(SCHEMA)
    with Tx(conn):
        conn.executemany("INSERT INTO jobs (status) VALUES ('queued')", [()] * a.jobs)
    total = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    log("init", db=a.db, added=a.jobs, jobs=total)
    return 0


def cmd_status(a):
    conn = connect(a.db)
    conn.executescript(SCHEMA)
    now = time.time()
    rows = conn.execute(
        "SELECT j.id, j.status, j.attempts, coalesce(j.claimed_by, '-'),"
        " (SELECT count(*) FROM completions c WHERE c.job_id = j.id)"
        " FROM jobs j ORDER BY j.id").fetchall()
    counts = {"queued": 0, "running": 0, "done": 0}
    dup = 0
    for jid, status, attempts, by, comp in rows:
        counts[status] += 1
        if comp > 1:
            dup += 1
        print(f"job id={jid} status={status} attempts={attempts} claimed_by={fmt(by)} completions={comp}")
    for res, host, pid, token, hb in conn.execute(
            "SELECT resource, holder_host, holder_pid, token, heartbeat_at FROM leases ORDER BY resource"):
        state = "released" if pid is None else ("stale" if now - hb >= a.stale else "fresh")
        age = "-" if pid is None else f"{now - hb:.3f}s"
        print(f"lease resource={fmt(res)} host={fmt(host)} pid={pid if pid is not None else '-'} "
              f"token={token} age={age} state={state}")
    completions = conn.execute("SELECT count(*) FROM completions").fetchone()[0]
    print(f"summary jobs={len(rows)} queued={counts['queued']} running={counts['running']} "
          f"done={counts['done']} completions={completions} duplicates={dup}")
    return 0


# The sweeper's invariant: a job may be `running` only while its holder's lease is
# held and fresh. Every running job that breaks it is requeued. Running it twice
# changes nothing the second time (idempotent); a job of a live holder is never touched.
ORPHANS = """
    SELECT j.id, j.claimed_by, l.token, l.holder_pid, l.heartbeat_at
    FROM jobs j LEFT JOIN leases l ON l.holder_host = j.claimed_by
    WHERE j.status = 'running'
      AND (l.resource IS NULL OR l.holder_pid IS NULL OR l.heartbeat_at <= :cutoff)
    ORDER BY j.id
"""
REQUEUE_ORPHANS = """
    UPDATE jobs SET status = 'queued', claimed_by = NULL, claimed_at = NULL
    WHERE status = 'running'
      AND NOT EXISTS (SELECT 1 FROM leases l
                      WHERE l.holder_host = jobs.claimed_by
                        AND l.holder_pid IS NOT NULL
                        AND l.heartbeat_at > :cutoff)
"""


def cmd_sweep(a):
    conn = connect(a.db)
    conn.executescript(SCHEMA)
    now = time.time()
    cutoff = now - a.stale
    with Tx(conn):
        orphans = conn.execute(ORPHANS, {"cutoff": cutoff}).fetchall()
        n = conn.execute(REQUEUE_ORPHANS, {"cutoff": cutoff}).rowcount
        left = conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone()[0]
    for jid, by, token, pid, hb in orphans:
        why = "no_lease" if token is None else ("released" if pid is None else "stale")
        extra = {} if token is None or pid is None else {"lease_age": f"{now - hb:.3f}s"}
        log("requeued", job=jid, holder=by, reason=why, **extra)
    log("sweep", requeued=n, running_left=left)
    return 0


# ---------------------------------------------------------------------------
# the token file and `release`: drainit's --finish program
#
# `run` records the token it holds in a file private to its container; `release`
# frees the lease only while it still carries that token. Tokens only grow, so a
# newer holder's lease never matches; every start removes the file before it looks
# at the lease, so a file from an earlier run is never acted on. See README.md,
# "After a SIGKILL".


def remove_file(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log("token_file_failed", path=path, error=str(e))


def write_token_file(path, host, token):
    """A new file renamed over the old one: a kill at any point leaves one or the other,
    never half a file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"host={host} token={token}\n")
        os.replace(tmp, path)
    except BaseException:
        remove_file(tmp)
        raise


def read_token_file(path):
    """(host, token) from the file, or None when there is none. ValueError on garbage."""
    try:
        with open(path) as f:
            text = f.read(4096)
    except FileNotFoundError:
        return None
    kv = dict(p.split("=", 1) for p in text.split() if "=" in p)
    if "host" not in kv or not kv.get("token", "").isdigit():
        raise ValueError(f"{path}: not a token file: {text[:80]!r}")
    return kv["host"], int(kv["token"])


def cmd_release(a):
    """Free the lease this container's last worker held and requeue its running jobs.

    Run by drainit as --finish, after drainit has reaped the worker and everything
    left of it: the holder of the token in the file is provably gone. Fenced on that
    token, in one transaction with the requeue; idempotent (the file is removed once
    acted on, and the fenced update matches nothing a second time)."""
    status = os.environ.get("DRAINIT_WORKER_STATUS")
    if status is None:
        print(f"{PROG}: error: release frees the lease of a worker that must be provably gone: "
              "run it as drainit's --finish program (DRAINIT_WORKER_STATUS is not set)", file=sys.stderr)
        return 2
    ctx = {"worker": status, "deadline_reached": os.environ.get("DRAINIT_DEADLINE_REACHED", "-"),
           "stop_reason": os.environ.get("DRAINIT_STOP_REASON", "-")}
    if "DRAINIT_WORKER_STATUS_TEXT" in os.environ:
        ctx["status_text"] = os.environ["DRAINIT_WORKER_STATUS_TEXT"]
    try:
        held = read_token_file(a.token_file)
    except (OSError, ValueError) as e:
        log("release", host=a.host, outcome="token_file_unreadable", error=str(e), **ctx)
        return 1
    if held is None:
        log("release", host=a.host, outcome="nothing_held", **ctx)
        return 0
    host, token = held
    if host != a.host:
        # A misconfiguration (LEASE_HOST differs between run and release): act on nothing.
        log("release", host=a.host, outcome="other_host", file_host=host, token=token, **ctx)
        return 1
    conn = connect(a.db)
    conn.executescript(SCHEMA)
    resource = resource_of(a.host)
    with Tx(conn) as c:
        row = c.execute("SELECT holder_pid, token FROM leases WHERE resource = ?", (resource,)).fetchone()
        released = c.execute(
            "UPDATE leases SET holder_pid = NULL, heartbeat_at = 0"
            " WHERE resource = ? AND token = ? AND holder_pid IS NOT NULL",
            (resource, token)).rowcount == 1
        # While the lease carried our token, only our worker could claim under this host
        # (claims are fenced on the token, and taking the lease requeued older claims).
        requeued = c.execute(
            "UPDATE jobs SET status = 'queued', claimed_by = NULL, claimed_at = NULL"
            " WHERE status = 'running' AND claimed_by = ?", (a.host,)).rowcount if released else 0
    remove_file(a.token_file)
    if released:
        outcome, extra = "released", {}
    elif row is None:
        outcome, extra = "no_lease", {}
    elif row[1] != token:
        outcome, extra = "newer_holder", {"lease_token": row[1]}
    else:
        outcome, extra = "already_released", {}
    log("release", host=a.host, token=token, outcome=outcome, requeued=requeued, **extra, **ctx)
    return 0


# ---------------------------------------------------------------------------
# the worker


class Worker:
    def __init__(self, a):
        self.a = a
        self.host = a.host
        self.resource = resource_of(a.host)
        self.pid = os.getpid()
        self.token = None
        self.conn = connect(a.db)
        self.conn.executescript(SCHEMA)
        self.shutdown = Shutdown()
        self.notify = Notifier()
        self.lease_lost = False
        self._hb_stop = threading.Event()
        self._stop_logged = False

    # -- lease ---------------------------------------------------------------

    def acquire_lease(self):
        """Returns True when we hold the lease, False when a fresh one blocks us."""
        a, c = self.a, self.conn
        with Tx(c):
            now = time.time()
            row = c.execute("SELECT holder_pid, token, heartbeat_at FROM leases WHERE holder_host = ?",
                            (self.host,)).fetchone()
            if row is not None and row[0] is not None and now - row[2] < a.stale:
                age = now - row[2]
                remaining = a.stale - age
                self.blocked = dict(token=row[1], holder_pid=row[0], age=age, remaining=remaining)
                return False
            if row is None:
                token, how = 1, "new"
                c.execute("INSERT INTO leases (resource, holder_host, holder_pid, token, heartbeat_at)"
                          " VALUES (?, ?, ?, ?, ?)", (self.resource, self.host, self.pid, token, now))
            else:
                token = row[1] + 1
                how = "released" if row[0] is None else "stale"
                c.execute("UPDATE leases SET holder_pid = ?, token = ?, heartbeat_at = ?"
                          " WHERE holder_host = ? AND token = ?",
                          (self.pid, token, now, self.host, row[1]))
            # Whatever of our host is still `running` belongs to a predecessor that is gone
            # (its lease was released or went stale): hand it back to the queue.
            requeued = c.execute(
                "UPDATE jobs SET status = 'queued', claimed_by = NULL, claimed_at = NULL"
                " WHERE status = 'running' AND claimed_by = ?", (self.host,)).rowcount
        self.token = token
        if how == "stale":
            log("lease_reclaimed", host=self.host, token=token, old_token=row[1], old_pid=row[0],
                stale_for=f"{now - row[2]:.3f}s", requeued=requeued)
        else:
            log("lease_claimed", host=self.host, token=token, previous=how, requeued=requeued)
        return True

    def still_holds(self):
        return self.conn.execute(
            "SELECT 1 FROM leases WHERE resource = ? AND token = ? AND holder_pid IS NOT NULL",
            (self.resource, self.token)).fetchone() is not None

    def release_lease(self):
        """Compare-and-set: only if the lease still carries our token. Keeps the row (and
        its token) so the next holder's token is higher still."""
        n = self.conn.execute(
            "UPDATE leases SET holder_pid = NULL, heartbeat_at = 0"
            " WHERE resource = ? AND token = ? AND holder_pid IS NOT NULL",
            (self.resource, self.token)).rowcount
        return n == 1

    def heartbeat_loop(self):
        a = self.a
        conn = connect(a.db)
        last_ok = time.monotonic()
        while not self._hb_stop.wait(a.heartbeat):
            try:
                n = conn.execute(
                    "UPDATE leases SET heartbeat_at = ? WHERE resource = ? AND token = ?"
                    " AND holder_pid IS NOT NULL", (time.time(), self.resource, self.token)).rowcount
            except sqlite3.Error as e:
                log("heartbeat_failed", error=str(e))
                if time.monotonic() - last_ok >= a.stale:
                    n = 0
                else:
                    continue
            if n != 1:
                self.lease_lost = True
                log("lease_lost", host=self.host, token=self.token)
                self.shutdown.trigger("lease_lost")
                return
            last_ok = time.monotonic()
        conn.close()

    # -- jobs ----------------------------------------------------------------

    def claim(self):
        """One statement: the oldest queued job becomes ours, only while we hold the lease."""
        cur = self.conn.execute(
            "UPDATE jobs SET status = 'running', claimed_by = :host, claimed_at = :now,"
            "                attempts = attempts + 1"
            " WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT 1)"
            "   AND status = 'queued'"
            "   AND EXISTS (SELECT 1 FROM leases WHERE resource = :res AND token = :token"
            "               AND holder_pid IS NOT NULL)"
            " RETURNING id, attempts",
            {"host": self.host, "now": time.time(), "res": self.resource, "token": self.token})
        rows = cur.fetchall()
        return rows[0] if rows else None

    def mark_done(self, job_id):
        """Fenced: done only if the job is still ours and we still hold the lease token."""
        with Tx(self.conn) as c:
            n = c.execute(
                "UPDATE jobs SET status = 'done'"
                " WHERE id = ? AND status = 'running' AND claimed_by = ?"
                "   AND EXISTS (SELECT 1 FROM leases WHERE resource = ? AND token = ?"
                "               AND holder_pid IS NOT NULL)",
                (job_id, self.host, self.resource, self.token)).rowcount
            if n == 1:
                c.execute("INSERT INTO completions (job_id, holder_host, holder_pid, token, done_at)"
                          " VALUES (?, ?, ?, ?, ?)",
                          (job_id, self.host, self.pid, self.token, time.time()))
        return n == 1

    def hand_back(self, job_id):
        """Fenced too: a job someone else requeued and reclaimed is not ours to touch."""
        return self.conn.execute(
            "UPDATE jobs SET status = 'queued', claimed_by = NULL, claimed_at = NULL"
            " WHERE id = ? AND status = 'running' AND claimed_by = ?"
            "   AND EXISTS (SELECT 1 FROM leases WHERE resource = ? AND token = ?"
            "               AND holder_pid IS NOT NULL)",
            (job_id, self.host, self.resource, self.token)).rowcount == 1

    def work(self, job_id):
        """True when all steps ran, False when the shutdown token stopped it midway."""
        a = self.a
        if a.long_step:
            log("long_step", job=job_id, duration=humantime(a.step * a.steps))
            time.sleep(a.step * a.steps)  # never looks at the token (PEP 475 resumes it)
            return True
        for i in range(a.steps):
            if self.shutdown.wait(a.step):
                self.note_stop()
                log("job_interrupted", job=job_id, step=f"{i + 1}/{a.steps}")
                return False
        return True

    def note_stop(self):
        """Log a stop signal once, from the main loop (never from the handler)."""
        r = self.shutdown.reason
        if r and r != "lease_lost" and not self._stop_logged:
            self._stop_logged = True
            log("stop_requested", signal=r)

    # -- main ----------------------------------------------------------------

    def run(self):
        a = self.a
        self.shutdown.install(a.ignore_sigterm)
        attempt = os.environ.get("DRAINIT_ATTEMPT", "-")
        log("worker_started", host=self.host, pid=self.pid, attempt=attempt, db=a.db,
            stale=humantime(a.stale), heartbeat=humantime(a.heartbeat),
            step=humantime(a.step), steps=a.steps,
            **({"ignore_sigterm": 1} if a.ignore_sigterm else {}),
            **({"long_step": 1} if a.long_step else {}),
            **({"wedge_at_job": a.wedge_at_job} if a.wedge_at_job else {}),
            **({"eat_at_job": a.eat_at_job, "eat_mib": a.eat_mib} if a.eat_at_job else {}))

        # Whatever an earlier attempt left there names a token older than any we take now.
        remove_file(a.token_file)
        if not self.acquire_lease():
            b = self.blocked
            retry = b["remaining"] + 0.05  # a hair past the threshold, so the next try sees it stale
            path = os.environ.get("DRAINIT_RETRY_AFTER_FILE")
            if path:
                with open(path, "w") as f:
                    f.write(humantime(retry))
            log("lease_busy", host=self.host, token=b["token"], holder_pid=b["holder_pid"],
                age=f"{b['age']:.3f}s", retry_after=humantime(retry), code=EX_TEMPFAIL)
            return EX_TEMPFAIL

        try:
            write_token_file(a.token_file, self.host, self.token)
        except OSError as e:
            # Only `release` needs it: without it a SIGKILLed worker's lease waits to go stale.
            log("token_file_failed", path=a.token_file, error=str(e))

        hb = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        hb.start()
        # Ready only now: a worker that backs off (exit 75) above never was.
        self.notify.send("READY=1", "STATUS=in_flight=0")

        in_flight = None
        done = 0
        claimed = 0
        while True:
            if self.shutdown.is_set():
                break
            job = self.claim()
            # The watchdog's ping, once per turn of this loop and from nowhere else
            # (never from the heartbeat thread): it says that jobs are being taken and
            # finished, not merely that the process is alive. The loop's longest honest
            # turn is one job (or one poll), so --watchdog goes above that.
            self.notify.send("WATCHDOG=1", f"STATUS=job={job[0]}" if job else "STATUS=in_flight=0")
            if job is None:
                if not self.still_holds():
                    self.lease_lost = True
                    log("lease_lost", host=self.host, token=self.token)
                    break
                if a.poll > 0:
                    self.shutdown.wait(a.poll)
                    continue
                log("queue_empty", done=done)
                break
            job_id, attempts = job
            in_flight = job_id
            claimed += 1
            log("job_started", job=job_id, attempt=attempts, token=self.token)
            if claimed == a.wedge_at_job:
                log("wedged", job=job_id, nth=claimed)
                wedge_forever()
            eaten = None
            if claimed == a.eat_at_job:
                log("eating", job=job_id, nth=claimed, mib=a.eat_mib)
                eaten = eat(a.eat_mib)
                log("eaten", job=job_id, mib=a.eat_mib)
            if not self.work(job_id):
                break
            del eaten  # held for the job's whole work, as a job's data would be
            if self.mark_done(job_id):
                done += 1
                in_flight = None
                log("job_done", job=job_id, token=self.token)
            else:
                # Fenced out: our lease moved on while we worked. Nothing of ours to hand back.
                in_flight = None
                self.lease_lost = True
                log("job_fenced", job=job_id, token=self.token)
                break
        self.note_stop()
        # Leaving the loop: no more pings, and none are owed (the watchdog is disarmed).
        self.notify.send("STOPPING=1")

        self._hb_stop.set()
        hb.join(timeout=5)
        requeued = 0
        if in_flight is not None and not self.lease_lost:
            requeued = 1 if self.hand_back(in_flight) else 0
            if requeued:
                log("job_requeued", job=in_flight)
        released = (not self.lease_lost) and self.release_lease()
        # Released, or lost to someone else: either way nothing is left for `release`.
        remove_file(a.token_file)
        code = 1 if self.lease_lost else 0
        log("exit", code=code, done=done, in_flight=0 if in_flight is None else 1,
            requeued=requeued, lease_released=int(released),
            **({"reason": self.shutdown.reason} if self._stop_logged else {}))
        return code


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if a.cmd == "init":
            return cmd_init(a)
        if a.cmd == "status":
            return cmd_status(a)
        if a.cmd == "sweep":
            return cmd_sweep(a)
        if a.cmd == "release":
            return cmd_release(a)
        return Worker(a).run()
    except sqlite3.Error as e:
        log("db_error", error=str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
