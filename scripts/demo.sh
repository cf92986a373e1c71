#!/usr/bin/env bash
# make demo: Rocket Rides end to end on a fresh database.
#
#   1. (re)creates the database idemd_demo and runs `bin/idemctl migrate`;
#   2. starts Rocket Rides (API + fake Stripe + receipt worker) with a few
#      injected faults, and the enqueuer and completer daemons;
#   3. runs the simulator: riders, some with declined cards, some clients
#      giving up mid-request (abandoned keys);
#   4. switches the faults off, runs the completer, enqueuer and reaper once
#      more (the reaper after backdating some keys by three days, so there is
#      something to reap and one stuck key to flag);
#   5. prints a summary from SQL, the simulator and the fake Stripe, every
#      number with what it counts.
#
# Every process it starts is stopped on exit; the database stays.
#   DEMO_KEEP=1      keep everything running after the summary (API, fake
#                    Stripe, faults, metrics) until Ctrl-C, and say where
#   DEMO_DB=name     the database to (re)create (default idemd_demo)
#   DEMO_PG_URL=url  the server (default postgres://postgres@127.0.0.1:5432)
#   DEMO_DURATION    the simulator's run time (default 25s)
# A daemon binary missing from bin/ is skipped with a warning.
set -euo pipefail
cd "$(dirname "$0")/.."

DB=${DEMO_DB:-idemd_demo}
PGHOST_URL=${DEMO_PG_URL:-postgres://postgres@127.0.0.1:5432}
ADMIN_URL="$PGHOST_URL/postgres?sslmode=disable"
export DATABASE_URL="$PGHOST_URL/$DB?sslmode=disable"
DURATION=${DEMO_DURATION:-25s}
# Rocket Rides draws FAULT_RATE at each of a request's fault points (below).
FAULT_RATE=0.05
GIVE_UP_RATE=0.15
MAX_RETRIES=2

API_ADDR=127.0.0.1:18080
ADMIN_ADDR=127.0.0.1:18081
STRIPE_ADDR=127.0.0.1:18111
RR_OPS=127.0.0.1:19090
ENQ_OPS=127.0.0.1:19091
COMP_OPS=127.0.0.1:19092

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idemd-demo.XXXXXX")
PIDS=()

say()  { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
warn() { printf '\033[33mwarning: %s\033[0m\n' "$*" >&2; }

cleanup() {
  local code=$?
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$code" -ne 0 ]; then
    echo "demo failed; logs kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# psql without NOTICEs (DROP DATABASE IF EXISTS of a missing one).
psql() { PGOPTIONS='-c client_min_messages=warning' command psql "$@"; }
sql() { psql "$DATABASE_URL" -X -q -A -t -v ON_ERROR_STOP=1 -c "$1"; }
# sim FIELD: a count from the simulator's JSON summary.
sim() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$WORK/simulator.json"; }

have() { [ -x "bin/$1" ] || { warn "bin/$1 is missing; skipping the $1"; return 1; }; }

# wait_for URL: poll until it answers, for at most 30 s.
wait_for() {
  for _ in $(seq 1 150); do
    if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.2
  done
  echo "timed out waiting for $1" >&2
  return 1
}

# start NAME CMD...: run in the background, logging to $WORK/NAME.log.
start() {
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  echo "started $name (pid $!, log $WORK/$name.log)"
}

say "fresh database $DB"
psql "$ADMIN_URL" -X -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
[ -x bin/idemctl ] || { echo "bin/idemctl is missing: run make build" >&2; exit 1; }
# Each migration's log line goes to a file; the one-line result is shown.
bin/idemctl migrate --log-format console --log-level warn 2>"$WORK/migrate.log" || {
  cat "$WORK/migrate.log" >&2
  exit 1
}

say "building Rocket Rides"
go build -o "$WORK/rocketrides" ./examples/rocketrides/cmd/rocketrides
go build -o "$WORK/simulator" ./examples/rocketrides/cmd/rocketrides-simulator

# The replay secret, shared by the API and the completer, only in a file.
head -c 48 /dev/urandom | base64 | tr -d '\n' >"$WORK/replay-secret"
chmod 600 "$WORK/replay-secret"

say "starting Rocket Rides, the enqueuer and the completer"
# Injected 500s: with no --fault-at, Rocket Rides draws FAULT_RATE at each
# of a request's fault points (before any work, and at the start of each of
# its three phases). The fake Stripe takes 30 ms per charge, so clients that
# give up really leave keys half done.
start rocketrides "$WORK/rocketrides" --log-format console --log-level warn \
  --addr "$API_ADDR" --admin-addr "$ADMIN_ADDR" --stripe-addr "$STRIPE_ADDR" --http-addr "$RR_OPS" \
  --stripe-latency 30ms --fault-rate "$FAULT_RATE" --replay-secret-file "$WORK/replay-secret"
RR_PID=${PIDS[-1]}
wait_for "http://$API_ADDR/healthz"

if have enqueuer; then
  start enqueuer bin/enqueuer --log-format console --http-addr "$ENQ_OPS"
fi
# Short grace and backoff so the completer acts within the demo's minute;
# production defaults are minutes.
COMPLETER_FLAGS=(--log-format console --api-url "http://$API_ADDR" --auth-secret-file "$WORK/replay-secret"
  --grace 2s --idle 2s --backoff-base 1s --backoff-max 3s --in-progress-delay 1s --poll-interval 1s
  --breaker-cooldown 1s --breaker-max-cooldown 3s)
if have completer; then
  start completer bin/completer "${COMPLETER_FLAGS[@]}" --http-addr "$COMP_OPS"
fi

say "simulating traffic for $DURATION (declines, clients giving up, injected 500s)"
"$WORK/simulator" --log-format console --api-url "http://$API_ADDR" --duration "$DURATION" \
  --users 6 --decline-users 1 --concurrency 8 --give-up-rate "$GIVE_UP_RATE" --give-up-after 60ms \
  --max-retries "$MAX_RETRIES" --json >"$WORK/simulator.json"
echo "$(sim rides) rides, $(sim requests) requests"

say "faults off; one more pass of the completer and the enqueuer"
curl -fsS -X PUT -d '[]' "http://$ADMIN_ADDR/faults" >/dev/null
# The long-running daemons keep going (their metrics stay up); the --once
# passes run next to them, as a second replica would, which the lease (the
# completer) and SKIP LOCKED (the enqueuer) make safe.
if have completer; then
  # Keys touched in the last seconds are still inside --grace/--idle.
  sleep 3
  bin/completer "${COMPLETER_FLAGS[@]}" --once >"$WORK/completer-once.log" 2>&1 \
    || warn "completer --once failed (see $WORK/completer-once.log)"
fi
if have enqueuer; then
  bin/enqueuer --log-format console --once >"$WORK/enqueuer-once.log" 2>&1 \
    || warn "enqueuer --once failed (see $WORK/enqueuer-once.log)"
fi

# The receipt worker runs inside rocketrides: wait (bounded) for River to
# work every job the enqueuer moved.
for _ in $(seq 1 150); do
  pending=$(sql "SELECT count(*) FROM river_job WHERE state IN ('available','running','retryable','scheduled','pending')")
  [ "$pending" = 0 ] && break
  sleep 0.2
done

say "three days later: backdating keys, then one reaper run"
# Three days is past the 72 h retention: the oldest finished keys become
# reapable, and one synthetic stuck key (a user the API does not know, so
# nothing can ever finish it) shows how unfinished keys are flagged, never
# silently deleted.
sql "UPDATE idempotency_keys SET created_at = created_at - interval '73 hours'
     WHERE id IN (SELECT id FROM idempotency_keys WHERE recovery_point = 'finished' ORDER BY id LIMIT 25)" >/dev/null
sql "INSERT INTO idempotency_keys (created_at, idempotency_key, user_id, locked_at, last_run_at, request_method,
       request_path, request_params, recovery_point)
     VALUES (now() - interval '73 hours', 'demo-stuck-key-0000000001', 0, NULL, now() - interval '73 hours', 'POST',
       '/rides', '{}', 'ride_created')" >/dev/null
REAPED=n/a
OLD=$(sql "SELECT count(*) FROM idempotency_keys WHERE created_at < now() - interval '72 hours'")
if have reaper; then
  bin/reaper --log-format console --once >"$WORK/reaper.log" 2>&1 \
    || warn "reaper --once failed (see $WORK/reaper.log)"
  REAPED=$(( OLD - $(sql "SELECT count(*) FROM idempotency_keys WHERE created_at < now() - interval '72 hours'") ))
fi

STATS=$(curl -fsS "http://$STRIPE_ADDR/_fake/stats" || echo '{}')
field() { printf '%s' "$STATS" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
REQUESTS=$(sim requests)
FIVEXX_PCT=$(( 100 * $(sim errors_5xx) / (REQUESTS > 0 ? REQUESTS : 1) ))
# The share of first requests that meet at least one of four faults.
FAULTED_PCT=$(awk -v r="$FAULT_RATE" 'BEGIN { printf "%.0f", 100 * (1 - (1 - r) ^ 4) }')

say "summary"
cat <<EOF
traffic              the simulator's riders for $DURATION; each ride is one POST /rides with its own Idempotency-Key
  rides              $(sim rides) = created + declined + gave_up + abandoned + rejected
  created            $(sim created)  answered 201: the ride exists and its charge succeeded
  declined           $(sim declined)  answered 402: the card was declined (the key is finished too)
  gave_up            $(sim gave_up)  the client walked away mid-request on purpose (a $GIVE_UP_RATE share of rides, within 60 ms) and never retried:
                     the API finishes what it had started, or leaves the key unfinished for the completer
  abandoned          $(sim abandoned)  the client retried the same key $MAX_RETRIES times, every answer a 5xx or 409, and stopped: the key is left
                     unfinished for the completer
  rejected           $(sim rejected)  any other 4xx: a bug in the API or the simulator; must be 0
  requests           $REQUESTS  HTTP requests, retries included; $(sim conflicts) answered 409 (the key was busy in another request) and were retried
  5xx                $(sim errors_5xx)  $FIVEXX_PCT % of requests: the injected 500s. The fault rate $FAULT_RATE is drawn at each of a
                     request's four fault points (before any work, then at the start of each phase), so about $FAULTED_PCT %
                     of first requests fail somewhere; a retry resumes at its key's recovery point, past fewer points

rides                $(sql "SELECT count(*) FROM rides") in the database, $(sql "SELECT count(*) FROM rides WHERE stripe_charge_id IS NOT NULL") charged (every ride the API got as far as creating, declined ones and
                     the ones the completer finished included)
fake Stripe          $(field charges) charges ($(field succeeded) succeeded, $(field failed) declined), $(field requests) requests, $(field replays) answered from a stored Idempotency-Key
double charges       $(sql "SELECT count(*) FROM (SELECT stripe_charge_id FROM rides WHERE stripe_charge_id IS NOT NULL GROUP BY 1 HAVING count(*) > 1) d") (rides sharing a charge; must be 0)
keys                 $(sql "SELECT string_agg(recovery_point || '=' || n, ', ' ORDER BY recovery_point) FROM (SELECT recovery_point, count(*) n FROM idempotency_keys GROUP BY 1) k") (by recovery point)
  finished by completer  $(sql "SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' AND completer_attempts > 0") (keys clients left unfinished that the completer replayed to the end)
  given up by completer  $(sql "SELECT count(*) FROM idempotency_keys WHERE completer_gave_up_at IS NOT NULL")
  reaped                 $REAPED (keys past the 72 h retention, deleted)
  flagged for review     $(sql "SELECT count(*) FROM idempotency_key_reviews WHERE resolved_at IS NULL") open review(s): $(sql "SELECT coalesce(string_agg(idempotency_key || ' (' || reason || ')', ', '), '-') FROM idempotency_key_reviews WHERE resolved_at IS NULL")
jobs                 $(sql "SELECT count(*) FROM staged_jobs") still staged, $(sql "SELECT count(*) FROM staged_jobs_dead") dead-lettered, River: $(sql "SELECT coalesce(string_agg(state || '=' || n, ', ' ORDER BY state), 'none') FROM (SELECT state::text, count(*) n FROM river_job GROUP BY 1) j")
receipts             $(sql "SELECT count(*) FROM ride_receipts") sent for $(sql "SELECT count(*) FROM rides WHERE stripe_charge_id IS NOT NULL") charged rides (one each: $(sql "SELECT count(*) FROM (SELECT ride_id FROM ride_receipts GROUP BY 1 HAVING count(*) > 1) d") rides with more than one)
EOF

if [ "${DEMO_KEEP:-}" != 1 ]; then
  cat <<EOF

The API, the fake Stripe and the daemons stop now; the database $DB stays:
  bin/idemctl status --database-url '$DATABASE_URL'
  bin/idemctl review list --database-url '$DATABASE_URL'
  psql '$DATABASE_URL'
To look around while everything runs (API, fake Stripe, faults, metrics):
  DEMO_KEEP=1 make demo      (Ctrl-C stops it; DEMO_DB=name uses another database)
EOF
fi

if [ "${DEMO_KEEP:-}" = 1 ]; then
  say "DEMO_KEEP=1: everything keeps running until Ctrl-C"
  cat <<EOF
  API                http://$API_ADDR/rides (Authorization: Bearer <key>, Idempotency-Key)
  fake Stripe        http://$STRIPE_ADDR/_fake/stats   http://$STRIPE_ADDR/_fake/charges
  faults             http://$ADMIN_ADDR/faults (GET; PUT a JSON array of {at, rate, kind}; off now)
  metrics            http://$RR_OPS/metrics (rocketrides)  http://$ENQ_OPS/metrics (enqueuer)  http://$COMP_OPS/metrics (completer)
  database           bin/idemctl status --database-url '$DATABASE_URL'   psql '$DATABASE_URL'
  logs               $WORK
EOF
  wait "$RR_PID" || true
fi
