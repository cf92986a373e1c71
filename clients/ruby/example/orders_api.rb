#!/usr/bin/env ruby
# frozen_string_literal: true

# A minimal order API in Ruby on idemd's schema contract: the Ruby twin of
# clients/python/example/orders_api.py, with the same routes, answers and
# faults, so internal/testing/e2e/polyglot runs one test against both.
#
# Ruby's standard library, WEBrick (Debian's ruby-webrick) and ruby-pg,
# nothing else: the idempotency-key protocol of docs/api-authors.md written
# out by hand, as an API that is not in Go would, with idemd's replay
# verifier (clients/ruby/lib/idemd/replay_auth.rb) mounted as Rack
# middleware, so idemd's completer can finish what clients abandon.
# docs/languages/ruby.md walks through it.
#
# POST /orders {"sku": "book", "quantity": 2} with an Idempotency-Key and
# "Authorization: Bearer user-<id>" (a stand-in for the API's own
# authentication) goes through the recovery points
#
#     started        -> insert the order                       -> order_created
#     order_created  -> stage send_order_receipt, answer 201   -> finished
#
# as Go's idem does by default: Begin claims the key with autocommitted
# atomic statements, and each phase is one READ COMMITTED transaction that
# first locks the key row (SELECT ... FOR UPDATE), checks locked_at is still
# this request's, does its work and moves the key on. The job is staged in
# staged_jobs inside the last phase's transaction, so it exists exactly when
# the response does; idemd's enqueuer moves it to River.
#
# With --test-control, PUT /_test/faults sets faults for the end-to-end test:
# [{"at": "order_created", "action": "fail" | "hang", "seconds": 2}] fails or
# stalls each request as it reaches that recovery point.

require "digest"
require "json"
require "logger"
require "optparse"
require "pg"
require "securerandom"
require "stringio"
require "webrick"

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "idemd/replay_auth"

module OrdersAPI
  RA = Idemd::ReplayAuth

  # Messages of idem's error responses (idem/http.go).
  MSG_KEY_MISSING = "Please specify an idempotency key with the Idempotency-Key header."
  MSG_KEY_TOO_LONG = "Idempotency-Key must be at most 255 characters long."
  MSG_KEY_INVALID = "Idempotency-Key must be UTF-8 text without control characters."
  MSG_PARAMS_MISMATCH = "There was a mismatch between this request's parameters and the parameters " \
                        "of a previously stored request with the same Idempotency-Key."
  MSG_IN_PROGRESS = "An API request with the same Idempotency-Key is already in progress."
  MSG_CONFLICT = "Conflict detected with a concurrent request. Please retry with the same Idempotency-Key."
  MSG_INTERNAL = RA::MSG_INTERNAL

  RETRIES = 5 # deadlocks and serialization failures, per phase
  CLAIM_ROUNDS = 8 # Begin's rounds while the key changes under it
  POOL_SIZE = 32

  class HTTPError < StandardError
    attr_reader :status

    def initialize(status, msg)
      super(msg)
      @status = status
    end
  end

  class LockLost < HTTPError
    def initialize
      super(409, MSG_CONFLICT)
    end
  end

  class InjectedFault < StandardError; end

  module_function

  # idem.CanonicalParams for this API's parameters (a string and an
  # integer): sorted keys, no whitespace. Stored in request_params and
  # fingerprinted, so the completer's replay of the stored params (after a
  # JSONB round trip) gives the same bytes.
  def canonical_params(params)
    JSON.generate(params.sort.to_h)
  end

  # idem.Fingerprint: hex SHA-256 of "idemd-fp-v1\nMETHOD\npath\ncanonical".
  def fingerprint(method, path, canon)
    Digest::SHA256.hexdigest(["idemd-fp-v1", method.upcase, path, canon].join("\n"))
  end

  def parse_params(body)
    doc = begin
      JSON.parse(body.to_s.empty? ? "{}" : body)
    rescue JSON::ParserError
      raise HTTPError.new(400, "Could not read the request body.")
    end
    raise HTTPError.new(422, "The body must be a JSON object.") unless doc.is_a?(Hash)

    sku = doc["sku"]
    qty = doc["quantity"]
    unless sku.is_a?(String) && sku.length.between?(1, 100)
      raise HTTPError.new(422, "sku must be a string of 1 to 100 characters.")
    end

    qty = qty.to_i if qty.is_a?(Float) && qty.finite? && qty == qty.floor
    unless qty.is_a?(Integer) && qty.between?(1, 100)
      raise HTTPError.new(422, "quantity must be an integer from 1 to 100.")
    end

    { "sku" => sku, "quantity" => qty }
  end

  def validate_key(key)
    raise HTTPError.new(400, MSG_KEY_MISSING) if key.nil? || key.empty?

    RA.validate_key(key)
  rescue RA::Refused => e
    raise HTTPError.new(400, e.message.include?("long") ? MSG_KEY_TOO_LONG : MSG_KEY_INVALID)
  end

  # Faults set through PUT /_test/faults.
  class Faults
    def initialize
      @rules = []
      @mutex = Mutex.new
    end

    def set(rules)
      @mutex.synchronize { @rules = rules.to_a }
    end

    def at(point)
      rules = @mutex.synchronize { @rules.select { |r| r["at"] == point } }
      rules.each do |r|
        sleep(Float(r.fetch("seconds", 3600))) if r["action"] == "hang"
        raise InjectedFault, "injected fault at #{point}"
      end
    end
  end

  # Connections made as callers need them, up to POOL_SIZE, each used by
  # one caller at a time.
  class Pool
    def initialize(url, size)
      @url = url
      @size = size
      @idle = Queue.new
      @made = 0
      @mutex = Mutex.new
    end

    def with
      conn = take
      begin
        yield conn
      ensure
        # A connection left inside a failed transaction is closed, not reused.
        if conn.finished? || conn.transaction_status != PG::PQTRANS_IDLE
          conn.close unless conn.finished?
          @mutex.synchronize { @made -= 1 }
        else
          @idle << conn
        end
      end
    end

    private

    def take
      begin
        return @idle.pop(true)
      rescue ThreadError
        nil
      end
      grow = @mutex.synchronize { @made < @size ? (@made += 1) : nil }
      return @idle.pop unless grow

      PG.connect(@url)
    rescue StandardError
      @mutex.synchronize { @made -= 1 } if grow
      raise
    end
  end

  # The API: the protocol and the phases of POST /orders, as a Rack app.
  class API
    def initialize(pool, lock_timeout, faults, logger)
      @pool = pool
      @lock_timeout = lock_timeout
      @faults = faults
      @log = logger
    end

    # -- Database plumbing -------------------------------------------------

    # One autocommitted statement: the query callable of the replay
    # verifier's nonce store and key lookup (it returns the PG::Result).
    def query(sql, params)
      @pool.with { |c| c.exec_params(sql, params) }
    end

    # One autocommitted statement; its first row (an Array) or nil.
    def row(sql, params)
      query(sql, params).values.first
    end

    # Runs the block in one READ COMMITTED transaction, again on a deadlock
    # or serialization failure, with jittered backoff; then 409.
    def transaction
      (RETRIES + 1).times do |attempt|
        begin
          out = @pool.with do |c|
            c.exec("BEGIN ISOLATION LEVEL READ COMMITTED")
            begin
              res = yield c
              c.exec("COMMIT")
              res
            rescue StandardError
              c.exec("ROLLBACK") unless c.finished?
              raise
            end
          end
          return out
        rescue PG::TRSerializationFailure, PG::TRDeadlockDetected
          nil
        end
        sleep(rand * [0.1, 0.002 * (2**attempt)].min)
      end
      raise HTTPError.new(409, MSG_CONFLICT)
    end

    # -- The protocol ------------------------------------------------------

    # Claims the key (idem's Begin) with autocommitted statements, each
    # atomic on its own: insert it locked, or take the existing one if it is
    # unfinished and unlocked. Returns the key as a Hash; a finished key
    # comes back unlocked, for replay.
    def begin_key(user_id, key, method, path, canon, fp)
      CLAIM_ROUNDS.times do
        r = row(<<~SQL, [key, user_id, method, path, canon, fp, SecureRandom.uuid])
          INSERT INTO idempotency_keys
              (idempotency_key, user_id, locked_at, last_run_at, request_method,
               request_path, request_params, request_fingerprint, recovery_point,
               upstream_idempotency_key)
          VALUES ($1, $2, now(), now(), $3, $4, $5::jsonb, $6, 'started', $7)
          ON CONFLICT (user_id, idempotency_key) DO NOTHING
          RETURNING id, recovery_point, locked_at
        SQL
        return { id: r[0], recovery_point: r[1], locked_at: r[2] } if r

        r = row(<<~SQL, [@lock_timeout, user_id, key])
          SELECT id, recovery_point, request_fingerprint, response_code, response_body,
                 locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => $1)
          FROM idempotency_keys WHERE user_id = $2 AND idempotency_key = $3
        SQL
        next if r.nil? # deleted since the insert found it: insert again

        kid, point, stored_fp, code, body, locked = r
        raise HTTPError.new(422, MSG_PARAMS_MISMATCH) if !stored_fp.nil? && stored_fp != fp
        return { id: kid, recovery_point: point, response_code: Integer(code), response_body: body } if point == "finished"
        raise HTTPError.new(409, MSG_IN_PROGRESS) if locked == "t"

        # PostgreSQL re-checks this WHERE after a concurrent writer commits:
        # of two requests taking one key, one gets the row.
        r = row(<<~SQL, [fp, SecureRandom.uuid, kid, @lock_timeout])
          UPDATE idempotency_keys SET locked_at = now(), last_run_at = now(),
              request_fingerprint = COALESCE(request_fingerprint, $1),
              upstream_idempotency_key = COALESCE(upstream_idempotency_key, $2)
          WHERE id = $3 AND recovery_point <> 'finished'
            AND (locked_at IS NULL OR locked_at <= now() - make_interval(secs => $4))
          RETURNING recovery_point, locked_at
        SQL
        return { id: kid, recovery_point: r[0], locked_at: r[1] } if r
        # Someone else changed the key meanwhile: look again.
      end
      raise HTTPError.new(409, MSG_CONFLICT)
    end

    # One atomic phase: the key row locked and checked to be still ours at
    # its recovery point, then the block does the work and returns the new
    # recovery point or a [status, body] response, applied to the key in the
    # same transaction.
    def phase(k)
      res = transaction do |c|
        held = c.exec_params("SELECT locked_at = $1 AND recovery_point = $2 FROM idempotency_keys WHERE id = $3 FOR UPDATE",
                             [k[:locked_at], k[:recovery_point], k[:id]]).values.first
        raise LockLost if held.nil? || held[0] != "t"

        out = yield c, k
        n = if out.is_a?(Array)
              c.exec_params("UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished', " \
                            "response_code = $1, response_body = $2 WHERE id = $3 AND locked_at = $4",
                            [out[0], out[1], k[:id], k[:locked_at]]).cmd_tuples
            else
              c.exec_params("UPDATE idempotency_keys SET recovery_point = $1 WHERE id = $2 AND locked_at = $3",
                            [out, k[:id], k[:locked_at]]).cmd_tuples
            end
        raise LockLost if n != 1

        out
      end
      if res.is_a?(Array)
        k.merge!(recovery_point: "finished", response_code: res[0], response_body: res[1], locked_at: nil)
      else
        k[:recovery_point] = res
      end
    rescue LockLost
      raise # the key is another request's now: leave its lock alone
    rescue StandardError
      unlock(k)
      raise
    end

    # Releases our lock so a retry (the client's or the completer's) need
    # not wait for the lock timeout; the timeout is the backstop.
    def unlock(k)
      query("UPDATE idempotency_keys SET locked_at = NULL WHERE id = $1 AND locked_at = $2", [k[:id], k[:locked_at]])
    rescue StandardError => e
      @log.warn("unlock of key #{k[:id]} failed; it stays locked until the lock timeout: #{e.message}")
    end

    # -- The phases of POST /orders --------------------------------------

    def create_order(c, k)
      @faults.at("started")
      c.exec_params("INSERT INTO orders (user_id, key_id, sku, quantity) VALUES ($1, $2, $3, $4)",
                    [k[:user_id], k[:id], k[:params]["sku"], k[:params]["quantity"]])
      "order_created"
    end

    def stage_receipt(c, k)
      @faults.at("order_created")
      order_id = Integer(c.exec_params("SELECT id FROM orders WHERE key_id = $1", [k[:id]]).getvalue(0, 0))
      # The job exists exactly when this transaction commits. NULL in an
      # optional column means River's default.
      c.exec_params(<<~SQL, [JSON.generate({ "order_id" => order_id }), "{orders}", JSON.generate({ "source" => "ruby-example" })])
        INSERT INTO staged_jobs
            (job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata)
        VALUES ('send_order_receipt', $1::jsonb, 'receipts', 2, 5, NULL, $2::text[], $3::jsonb)
      SQL
      [201, JSON.generate({ "order_id" => order_id, "sku" => k[:params]["sku"], "quantity" => k[:params]["quantity"] })]
    end

    PHASES = { "started" => :create_order, "order_created" => :stage_receipt }.freeze

    def create(user_id, key, body)
      params = OrdersAPI.parse_params(body)
      canon = OrdersAPI.canonical_params(params)
      k = begin_key(user_id, key, "POST", "/orders", canon, OrdersAPI.fingerprint("POST", "/orders", canon))
      k.merge!(user_id: user_id, params: params)
      replayed = k[:recovery_point] == "finished"
      until k[:recovery_point] == "finished"
        step = PHASES[k[:recovery_point]]
        if step.nil?
          unlock(k)
          raise HTTPError.new(500, MSG_INTERNAL)
        end
        phase(k) { |c, kk| send(step, c, kk) }
      end
      [Integer(k[:response_code]), k[:response_body], replayed]
    end

    # -- Rack --------------------------------------------------------------

    def call(env)
      method = env["REQUEST_METHOD"]
      path = env["PATH_INFO"].to_s
      return respond(200, '{"status":"ok"}') if path == "/healthz"

      if path == "/_test/faults" && method == "PUT" && env["orders.test_control"]
        body = env["rack.input"].read
        @faults.set(JSON.parse(body.empty? ? "[]" : body))
        return respond(200, "{}")
      end
      raise HTTPError.new(404, "Not found.") if path != "/orders" || method != "POST"

      user_id = authenticate(env)
      key = OrdersAPI.validate_key(env["HTTP_IDEMPOTENCY_KEY"].to_s.b)
      status, body, replayed = create(user_id, key, env["rack.input"].read)
      respond(status, body, replayed)
    rescue HTTPError => e
      respond(e.status, JSON.generate({ "error" => e.message }))
    rescue InjectedFault => e
      @log.warn("request failed: #{e.message}")
      respond(500, JSON.generate({ "error" => MSG_INTERNAL }))
    rescue StandardError => e # the key is unlocked; the client retries
      @log.error("request failed: #{e.class}: #{e.message}")
      respond(500, JSON.generate({ "error" => MSG_INTERNAL }))
    end

    # The replay path first: the middleware set this only for a valid
    # signature on an unfinished key of that user. Then the API's own
    # authentication (here a stand-in).
    def authenticate(env)
      uid = env[RA::USER_ID_KEY]
      unless uid.nil?
        @log.info("replay accepted user=#{uid} key=#{env['HTTP_IDEMPOTENCY_KEY']}")
        return uid
      end
      auth = env["HTTP_AUTHORIZATION"].to_s
      m = auth.match(/\ABearer user-([0-9]+)\z/)
      raise HTTPError.new(401, "Unauthorized.") unless m

      Integer(m[1], 10)
    end

    def respond(status, body, replayed = false)
      headers = { "content-type" => "application/json", "content-length" => body.bytesize.to_s }
      headers["idempotent-replayed"] = "true" if replayed
      [status, headers, [body]]
    end
  end

  # The API's own table. idemd's tables come from `idemctl migrate`.
  def migrate(api)
    api.query(<<~SQL, [])
      CREATE TABLE IF NOT EXISTS orders (
          id         BIGSERIAL   PRIMARY KEY,
          user_id    BIGINT      NOT NULL,
          key_id     BIGINT      NOT NULL UNIQUE, -- idempotency_keys.id; no FK: the reaper deletes keys
          sku        TEXT        NOT NULL,
          quantity   INT         NOT NULL,
          created_at TIMESTAMPTZ NOT NULL DEFAULT now())
    SQL
  end

  # Serves a Rack app with WEBrick (a thread per connection): the request
  # becomes a Rack env, the app's [status, headers, body] the response.
  def serve(app, addr, logger)
    host, port = addr.split(/:(?=[0-9]+\z)/)
    server = WEBrick::HTTPServer.new(BindAddress: host, Port: Integer(port), Logger: WEBrick::Log.new($stderr, WEBrick::Log::WARN),
                                     AccessLog: [], MaxClients: 256)
    server.mount_proc("/") do |req, res|
      env = {
        "REQUEST_METHOD" => req.request_method, "REQUEST_URI" => req.unparsed_uri,
        "PATH_INFO" => req.path, "QUERY_STRING" => req.query_string.to_s, "SCRIPT_NAME" => "",
        "CONTENT_LENGTH" => req["content-length"].to_s, "rack.input" => StringIO.new(req.body.to_s.b)
      }
      req.each { |name, value| env["HTTP_#{name.upcase.tr('-', '_')}"] = value }
      status, headers, body = app.call(env)
      res.status = status
      headers.each { |name, value| res[name] = value }
      res.body = body.join
    end
    %w[INT TERM].each { |sig| trap(sig) { server.shutdown } }
    logger.info("listening on #{addr}")
    server.start
  end

  def main(argv)
    opts = { addr: "127.0.0.1:8080", database_url: ENV.fetch("DATABASE_URL", nil), previous: "", lock_timeout: 90.0 }
    OptionParser.new do |o|
      o.banner = "A minimal order API in Ruby on idemd's schema contract."
      o.on("--addr ADDR") { |v| opts[:addr] = v }
      o.on("--database-url URL") { |v| opts[:database_url] = v }
      o.on("--replay-secret-file PATH") { |v| opts[:secret] = v }
      o.on("--replay-secret-file-previous PATH") { |v| opts[:previous] = v }
      o.on("--lock-timeout SECONDS", Float, "match the completer's --lock-timeout") { |v| opts[:lock_timeout] = v }
      o.on("--test-control", "serve PUT /_test/faults") { opts[:test_control] = true }
    end.parse!(argv)
    abort("--replay-secret-file is required") unless opts[:secret]
    $stderr.sync = true
    logger = Logger.new($stderr)
    logger.progname = "orders_api"

    api = API.new(Pool.new(opts[:database_url], POOL_SIZE), opts[:lock_timeout], Faults.new, logger)
    migrate(api)
    query = ->(sql, params) { api.query(sql, params) }
    verifier = RA::Verifier.new(RA.read_secret_files(opts[:secret], opts[:previous]),
                                nonce_store: RA::PostgresNonceStore.new(query, logger: logger))
    app = RA::Middleware.new(api, verifier: verifier, unfinished_key: RA::PostgresKeyLookup.new(query), logger: logger)
    if opts[:test_control]
      inner = app
      app = ->(env) { inner.call(env.merge("orders.test_control" => true)) }
    end
    serve(app, opts[:addr], logger)
  end
end

OrdersAPI.main(ARGV) if $PROGRAM_NAME == __FILE__
