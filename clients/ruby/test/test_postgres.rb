# frozen_string_literal: true

require "helpers"

# The PostgreSQL nonce store and key lookup on a real database, through
# ruby-pg (Debian's ruby-pg), as the API's role. The Go test that runs these
# (clients, TestRuby) creates the database, records a nonce through Go's
# idem.ReplayNonces first, and names it in IDEMD_GO_NONCE.
class TestPostgres < Minitest::Test
  RA = Idemd::ReplayAuth
  SECRET = "0123456789abcdef0123456789abcdef"
  DB = ENV.fetch("IDEMD_TEST_DATABASE_URL", nil)

  def setup
    skip "IDEMD_TEST_DATABASE_URL needed" unless DB
    require "pg"
    @conns = Queue.new
    @all = []
  end

  def teardown
    @all&.each(&:close)
  end

  # A connection per concurrent caller, kept for the test: what a pool does.
  def query
    lambda do |sql, params|
      c = begin
        @conns.pop(true)
      rescue ThreadError
        PG.connect(DB).tap { |n| @all << n }
      end
      begin
        c.exec_params(sql, params)
      ensure
        @conns << c
      end
    end
  end

  def scalar(sql, params = [])
    query.call(sql, params).getvalue(0, 0)
  end

  def test_use_records_once_with_the_window_as_expiry
    store = RA::PostgresNonceStore.new(query)
    assert store.use("rb-once", 1_800_000_300)
    refute store.use("rb-once", 1_800_000_300)
    assert_equal "1800000300", scalar("SELECT extract(epoch FROM expires_at)::bigint FROM idemd_replay_nonces WHERE nonce = $1", ["rb-once"])
  end

  def test_verifier_records_t_plus_skew
    v = RA::Verifier.new(SECRET, nonce_store: RA::PostgresNonceStore.new(query), clock: -> { 1_800_000_000 })
    h = RA.sign(SECRET, 1_800_000_000, "rb-verifier", "POST", "/orders", 42, "k", "{}")
    assert_equal 42, v.verify(h, "POST", "/orders", "k", "{}")
    assert_raises(RA::Replayed) { v.verify(h, "POST", "/orders", "k", "{}") }
    assert_equal "1800000300", scalar("SELECT extract(epoch FROM expires_at)::bigint FROM idemd_replay_nonces WHERE nonce = $1", ["rb-verifier"])
  end

  def test_nonce_recorded_by_go_is_refused
    nonce = ENV.fetch("IDEMD_GO_NONCE", nil)
    skip "IDEMD_GO_NONCE not set" unless nonce
    ts = Integer(ENV.fetch("IDEMD_GO_NONCE_TS"))
    v = RA::Verifier.new(SECRET, nonce_store: RA::PostgresNonceStore.new(query), clock: -> { ts })
    h = RA.sign(SECRET, ts, nonce, "POST", "/orders", 42, "k", "")
    assert_raises(RA::Replayed) { v.verify(h, "POST", "/orders", "k", "") }
  end

  def test_concurrent_uses_of_one_nonce
    store = RA::PostgresNonceStore.new(query)
    q = Queue.new
    threads = Array.new(8) { Thread.new { q << store.use("rb-race", 1_800_000_300) } }
    threads.each(&:join)
    results = Array.new(8) { q.pop }
    assert_equal 1, results.count(true)
    assert_equal 7, results.count(false)
  end

  def test_cleanup_bounded_batches_keeps_live_and_in_grace_rows
    q = query
    q.call("INSERT INTO idemd_replay_nonces (nonce, expires_at) " \
           "SELECT 'rb-old-' || i, now() - interval '10 minutes' FROM generate_series(1, 7) i", [])
    q.call("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES " \
           "('rb-in-grace', now() - interval '30 seconds'), ('rb-live', now() + interval '5 minutes')", [])
    clock = Helpers::Clock.new(0.0)
    store = RA::PostgresNonceStore.new(q, cleanup_batch: 3, cleanup_interval: 60, clock: clock)
    old = "SELECT count(*) FROM idemd_replay_nonces WHERE nonce LIKE 'rb-old-%'"
    store.use("rb-c1", 1_800_000_300) # a full batch of 3: again on the next use
    assert_equal "4", scalar(old)
    store.use("rb-c2", 1_800_000_300)
    assert_equal "1", scalar(old)
    store.use("rb-c3", 1_800_000_300) # 1 < 3: the next cleanup waits an interval
    assert_equal "0", scalar(old)
    q.call("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ('rb-old-8', now() - interval '10 minutes')", [])
    store.use("rb-c4", 1_800_000_300)
    assert_equal "1", scalar(old), "cleaned before the interval passed"
    clock.now = 60.0
    store.use("rb-c5", 1_800_000_300)
    assert_equal "0", scalar(old)
    assert_equal "2", scalar("SELECT count(*) FROM idemd_replay_nonces WHERE nonce IN ('rb-in-grace', 'rb-live')")
    assert_equal 8, store.deleted
  end

  def test_failed_cleanup_does_not_fail_the_request
    q = query
    failing = lambda do |sql, params|
      raise PG::ConnectionBad, "cleanup refused" if sql.start_with?("DELETE")

      q.call(sql, params)
    end
    store = RA::PostgresNonceStore.new(failing, logger: Helpers.quiet_logger)
    assert store.use("rb-cleanup-fails", 1_800_000_300)
    assert_equal 1, store.cleanup_errors
  end

  def test_unreachable_database_fails_closed
    down = ->(_sql, _params) { raise PG::ConnectionBad, "could not connect" }
    v = RA::Verifier.new(SECRET, nonce_store: RA::PostgresNonceStore.new(down), clock: -> { 1_800_000_000 })
    h = RA.sign(SECRET, 1_800_000_000, "rb-down", "POST", "/orders", 42, "k", "")
    assert_raises(RA::NonceStoreError) { v.verify(h, "POST", "/orders", "k", "") }
  end

  def test_key_lookup
    query.call("INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params, recovery_point) VALUES " \
               "('rb-open', 7, 'POST', '/orders', '{}', 'order_created'), ('rb-done', 7, 'POST', '/orders', '{}', 'finished')", [])
    lookup = RA::PostgresKeyLookup.new(query)
    assert lookup.call(7, "rb-open", "POST", "/orders")
    assert lookup.call(7, "rb-open", "post", "/orders"), "method compared case-insensitively"
    refute lookup.call(7, "rb-done", "POST", "/orders"), "finished key"
    refute lookup.call(8, "rb-open", "POST", "/orders"), "another user's key"
    refute lookup.call(7, "rb-open", "POST", "/orders/2"), "another path"
    refute lookup.call(7, "rb-open", "PUT", "/orders"), "another method"
    refute lookup.call(7, "rb-none", "POST", "/orders"), "no such key"
  end

  # Stages every unique-key vector's job with plain SQL and the helper's
  # key and states, as docs/languages/README.md shows. clients' Go TestRuby
  # inserted the same jobs with River's InsertTx before and moves these
  # rows with the enqueuer after: River must keep one job per vector.
  def test_stage_unique_vectors
    require "idemd/unique_key"
    vs = Helpers.unique_vectors
    vs.each do |v|
      u = v["unique"]
      key = Idemd::UniqueKey.unique_key(
        kind: v["kind"], args: v["args"], queue: v["queue"], by_args: u.fetch("by_args", false), fields: u["fields"],
        by_period: u["by_period"], by_queue: u.fetch("by_queue", false), exclude_kind: u.fetch("exclude_kind", false),
        at: Time.iso8601(v["at"])
      )
      query.call("INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states) " \
                 "VALUES ($1, $2, $3, $4, $5::bit(8))",
                 [v["kind"], JSON.generate(v["args"]), v["queue"], { value: key, format: 1 },
                  Idemd::UniqueKey.unique_states(u["by_state"])])
    end
    assert_equal vs.size.to_s, scalar("SELECT count(*) FROM staged_jobs WHERE job_name LIKE 'uk\\_%'")
  end
end
