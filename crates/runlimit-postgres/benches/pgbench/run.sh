#!/usr/bin/env bash
# The two-round-trip floor, measured with pgbench (a C client, lighter than SQLx per round trip).
#
#   PGHOST=127.0.0.1 PGUSER=postgres bash crates/runlimit-postgres/benches/pgbench/run.sh
#
# Creates the database `runlimit_pgbench`, applies the fixed-window and GCRA migrations, stores
# 512 counters, 512 GCRA rows over 256 shards (and 512 baseline rows), then runs each script at
# 8 clients for 4 s, three rounds interleaved, and prints transactions per second and the server
# CPU per transaction. RUNLIMIT_PGBENCH_SCRIPTS (names, space-separated), RUNLIMIT_PGBENCH_CLIENTS
# and RUNLIMIT_PGBENCH_SECONDS override the scripts, the 8 clients and the 4 s. Scripts:
#   baseline.sql              the cargo bench baseline: one autocommitted upsert (prepared)
#   bare_two_round_trips.sql  `BEGIN; UPDATE` then `COMMIT`: the cheapest transaction in which
#                             the client reads an answer before deciding to commit
#   runlimit_check.sql        what PostgresLimiter::check sends for a stored key, allowed:
#                             BEGIN, EXECUTE of the prepared lock, EXECUTE of the prepared
#                             preflight (the provisional increment), then COMMIT; each client
#                             first prepares the statements, from the crate's own
#                             src/sql/fixed_window_prepare_*.sql, once
#   gcra_check.sql            what PostgresGcraLimiter::check sends for a stored key, allowed:
#                             BEGIN, EXECUTE of the prepared settings, ledger lock and preflight
#                             (the provisional update of the arrival time), then COMMIT;
#                             prepared once per client like runlimit_check.sql
#   gcra_check_batch_statements.sql  the same check through the statements GCRA batches send
#                             (and one-check admissions sent in earlier releases): BEGIN,
#                             EXECUTE of the prepared settings, ledger lock and read, then
#                             EXECUTE of the prepared write and COMMIT (the arrival time written
#                             is the clock, not a GCRA decision: the server does the same work)
#   gcra_table_floor.sql      the floor's transaction on the GCRA table itself: BEGIN (with the
#                             isolation level and access mode every admission sets), one UPDATE
#                             of a stored row's arrival time and expiry (not HOT: the expiry is
#                             indexed, as an admission's update is) returning it, then COMMIT;
#                             what the table's shape costs before any protocol
#   gcra_row_lock_check.sql   what PostgresGcraLimiter::check sends for a stored key, allowed, on
#                             the row-lock protocol: BEGIN, EXECUTE of the prepared settings and
#                             of the one-check update, then COMMIT; run on a second database,
#                             runlimit_pgbench_rows, the same rows switched to row locks
#   previous_check.sql        what PostgresLimiter::check sent in earlier releases
#   simplified_check.sql      the previous phases as plain single-table statements
# Server CPU per transaction: user + system time (/proc/<pid>/stat, 10 ms ticks) of every
# PostgreSQL process over the run, including backends that exited (their time is added to the
# postmaster's reaped-children fields), divided by the transactions pgbench completed; it needs
# the server on this machine and /proc readable. Needs pgbench and psql on PATH or under
# /usr/lib/postgresql/*/bin. Drops the databases after.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(dirname "$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | tail -1)")"
db=runlimit_pgbench
psql() { "$bin/psql" -v ON_ERROR_STOP=1 -q "$@"; }
# CPU ticks used so far by every process named postgres: utime + stime + cutime + cstime.
server_ticks() {
  local total=0 pid stat fields
  for pid in $(pgrep -x postgres || true); do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    read -r -a fields <<< "${stat##*) }"
    total=$((total + fields[11] + fields[12] + fields[13] + fields[14]))
  done
  echo "$total"
}
psql -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP DATABASE IF EXISTS ${db}_rows WITH (FORCE)" -c "CREATE DATABASE $db"
for migration in "$here"/../../migrations/*.sql "$here"/../../gcra-migrations/*.sql; do
  psql -1 -d "$db" -f "$migration"
done
psql -d "$db" \
  -c "CREATE TABLE bench_baseline (counter_key bytea PRIMARY KEY, used bigint NOT NULL) WITH (fillfactor = 80)" \
  -c "INSERT INTO bench_baseline SELECT decode(lpad(to_hex(i), 128, '0'), 'hex'), 1 FROM generate_series(1, 512) AS i" \
  -c "INSERT INTO runlimit_fixed_windows (counter_key, used, window_started_at, window_expires_at)
      SELECT decode(lpad(to_hex(i), 128, '0'), 'hex'), 1, now(), now() + interval '10 days'
      FROM generate_series(1, 512) AS i" \
  -c "INSERT INTO runlimit_gcra (counter_key, tat_ms, tat_remainder, expires_at_ms)
      SELECT decode(lpad(to_hex(i), 64, '0') || lpad(to_hex(i % 256), 2, '0') || repeat('0', 62), 'hex'),
             0, 0, 0
      FROM generate_series(1, 512) AS i"
# The row-lock protocol's database: a copy of the one above, switched.
psql -d postgres -c "DROP DATABASE IF EXISTS ${db}_rows WITH (FORCE)" -c "CREATE DATABASE ${db}_rows TEMPLATE $db"
psql -d "${db}_rows" -c "SELECT public.runlimit_gcra_switch_to_row_locks()" > /dev/null
# The check scripts as run: each client prepares the statements once (its variable `prepared`
# persists across its transactions), then sends runlimit_check.sql or gcra_check.sql.
sql="$here/../../src/sql"
check_script="$(mktemp)"
gcra_script="$(mktemp)"
gcra_batch_script="$(mktemp)"
gcra_rows_script="$(mktemp)"
trap 'rm -f "$check_script" "$gcra_script" "$gcra_batch_script" "$gcra_rows_script"' EXIT
with_prepare() {
  local script="$1"; shift
  echo '\if :prepared = 0'
  cat "$@"
  echo '\set prepared 1'
  echo '\endif'
  cat "$script"
}
with_prepare "$here/runlimit_check.sql" "$sql/fixed_window_prepare_lock_one.sql" \
  "$sql/fixed_window_prepare_preflight_one.sql" > "$check_script"
with_prepare "$here/gcra_check.sql" "$sql/settings_prepare.sql" "$sql/gcra_prepare_lock_one.sql" \
  "$sql/gcra_prepare_preflight_one.sql" > "$gcra_script"
with_prepare "$here/gcra_check_batch_statements.sql" "$sql/settings_prepare.sql" \
  "$sql/gcra_prepare_lock_one.sql" "$sql/gcra_prepare_read_one.sql" "$sql/gcra_prepare_write_one.sql" \
  > "$gcra_batch_script"
with_prepare "$here/gcra_row_lock_check.sql" "$sql/settings_prepare.sql" "$sql/gcra_prepare_rowlock_admit_one.sql" \
  > "$gcra_rows_script"
scripts="${RUNLIMIT_PGBENCH_SCRIPTS:-baseline bare_two_round_trips runlimit_check gcra_table_floor gcra_check gcra_row_lock_check gcra_check_batch_statements previous_check simplified_check}"
clients="${RUNLIMIT_PGBENCH_CLIENTS:-8}"
seconds="${RUNLIMIT_PGBENCH_SECONDS:-4}"
for round in 1 2 3; do
  for script in $scripts; do
    mode=simple; [ "$script" = baseline ] && mode=prepared
    before=$(server_ticks)
    file="$here/$script.sql"
    [ "$script" = runlimit_check ] && file="$check_script"
    [ "$script" = gcra_check ] && file="$gcra_script"
    [ "$script" = gcra_check_batch_statements ] && file="$gcra_batch_script"
    target="$db"
    [ "$script" = gcra_row_lock_check ] && file="$gcra_rows_script" && target="${db}_rows"
    out=$("$bin/pgbench" -n -c "$clients" -j 2 -T "$seconds" -M "$mode" -D prepared=0 -f "$file" "$target" 2>&1)
    after=$(server_ticks)
    tps=$(awk '/^tps/ {print int($3)}' <<< "$out")
    transactions=$(awk '/number of transactions actually processed/ {split($NF, n, "/"); print n[1]}' <<< "$out")
    cpu="n/a"
    [ "${transactions:-0}" -gt 0 ] && cpu="$(( (after - before) * 10000 / transactions )) µs"
    echo "round $round  $script  $tps tps  server CPU $cpu per transaction"
  done
done
psql -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "DROP DATABASE IF EXISTS ${db}_rows WITH (FORCE)"
