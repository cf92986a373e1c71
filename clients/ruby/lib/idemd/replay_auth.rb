# frozen_string_literal: true

# idemd's replay verifier for Ruby APIs: Rack middleware.
#
# idemd's completer replays an abandoned request on behalf of the key's user
# with a signed header (docs/api-authors.md, "The replay signature"):
#
#   Idemd-Replay-Signature: t=<unix s>,n=<nonce>,u=<user id>,v1=<hex HMAC>[,v1=...]
#
# This file checks it exactly as Go's idem/replayauth and idem.ReplayAuth
# do: the header's parts, the skew window, HMAC-SHA256 over the canonical
# string compared in constant time (OpenSSL.fixed_length_secure_compare)
# against every secret held (two during a rotation), a nonce accepted once
# (in memory, or in idemd's PostgreSQL table idemd_replay_nonces shared with
# every replica in any language), and an existing unfinished key of the
# signed user for this method and path. Only then does the application see
# the user id, in env["idemd.replay_user_id"]. Refusals are 401
# {"error": "Replay signature rejected."}; a nonce store or key lookup that
# fails is a 503 the completer retries.
#
# No dependencies beyond Ruby's standard library (openssl, json, logger,
# stringio): the PostgreSQL parts take a callable that runs one
# parameterised statement on the application's own driver (ruby-pg's
# exec_params) and returns the number of rows it inserted, deleted or
# returned. See docs/languages/ruby.md.

require "json"
require "logger"
require "openssl"
require "stringio"

module Idemd
  module ReplayAuth
    HEADER = "Idemd-Replay-Signature"
    IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
    DEFAULT_SKEW = 300 # seconds, replayauth.DefaultSkew
    MIN_SECRET_LEN = 32 # bytes
    MAX_REPLAY_BODY = 1 << 20 # idem.MaxReplayBody
    MAX_KEY_LENGTH = 255 # characters, idem.MaxKeyLength
    MEMORY_SWEEP_INTERVAL = 60 # seconds, replayauth.MemorySweepInterval

    # Where the middleware hands the signed user id (an Integer) to the app.
    USER_ID_KEY = "idemd.replay_user_id"

    # Response bodies, idem.MsgReplayUnauthorized and idem.MsgInternal.
    MSG_UNAUTHORIZED = "Replay signature rejected."
    MSG_INTERNAL = "Internal server error. Please retry the request periodically " \
                   "with the same Idempotency-Key until it succeeds."

    # A refused replay. reason names it as the vectors do; status is the
    # HTTP status the middleware answers with.
    class Error < StandardError
      def reason = :refused
      def status = 401
    end

    class Missing < Error
      def reason = :missing
    end

    class Malformed < Error
      def reason = :malformed
    end

    class Expired < Error
      def reason = :expired
    end

    class Mismatch < Error
      def reason = :mismatch
    end

    class Replayed < Error
      def reason = :replayed
    end

    # Refused by the middleware rather than the signature: replay path
    # disabled, invalid Idempotency-Key, body too large, no unfinished key.
    class Refused < Error; end

    # The nonce could not be recorded: refused (fail closed) with a 503.
    class NonceStoreError < Error
      def reason = :nonce_store
      def status = 503
    end

    # The unfinished-key lookup failed: refused with a 503.
    class KeyLookupError < Error
      def reason = :key_lookup
      def status = 503
    end

    # An HMAC key of at least MIN_SECRET_LEN bytes; never printed.
    class Secret
      def initialize(raw)
        b = raw.is_a?(Secret) ? raw.bytes_for_mac : raw.to_s.b
        if b.bytesize < MIN_SECRET_LEN
          raise ArgumentError, "idemd replay_auth: secret is #{b.bytesize} bytes, need at least #{MIN_SECRET_LEN}"
        end

        @b = b.dup.freeze
      end

      def bytes_for_mac = @b
      def inspect = "[redacted]"
      def to_s = "[redacted]"
    end

    module_function

    def secrets(list)
      list = [list] unless list.is_a?(Array)
      raise ArgumentError, "idemd replay_auth: no secret configured" if list.empty?

      list.map { |s| s.is_a?(Secret) ? s : Secret.new(s) }
    end

    # Reads the current secret and, during a rotation, the previous one
    # (nil or empty paths are skipped), each stripped of whitespace.
    def read_secret_files(*paths)
      out = paths.compact.reject(&:empty?).map { |p| Secret.new(File.binread(p).strip) }
      raise ArgumentError, "idemd replay_auth: no secret configured" if out.empty?

      out
    end

    # The string that is MACed: the fields joined by newlines.
    def canonical(ts, nonce, method, path, user_id, key, body)
      [
        "idemd-replay-v1",
        Integer(ts).to_s,
        nonce.to_s.b,
        method.to_s.b.upcase,
        path.to_s.b,
        Integer(user_id).to_s,
        key.to_s.b,
        OpenSSL::Digest::SHA256.hexdigest(body.to_s.b)
      ].map(&:b).join("\n".b)
    end

    def mac(secret, msg)
      OpenSSL::HMAC.digest("SHA256", secret.bytes_for_mac, msg)
    end

    # The header idemd's completer would send (for tests of an API).
    def sign(secrets_list, ts, nonce, method, path, user_id, key, body)
      c = canonical(ts, nonce, method, path, user_id, key, body)
      parts = ["t=#{Integer(ts)}", "n=#{nonce}", "u=#{Integer(user_id)}"]
      (parts + secrets(secrets_list).map { |s| "v1=#{mac(s, c).unpack1('H*')}" }).join(",")
    end

    WS = /\A[ \t\n\v\f\r]+|[ \t\n\v\f\r]+\z/n
    INT64 = /\A[+-]?[0-9]+\z/n
    HEX32 = /\A[0-9a-fA-F]{64}\z/n

    def int64(v)
      raise Malformed, "signature header malformed" unless INT64.match?(v)

      n = Integer(v, 10)
      raise Malformed, "signature header malformed" unless n >= -(1 << 63) && n < (1 << 63)

      n
    end

    # Parsed header: timestamp, nonce (binary String), user id, signatures.
    Parsed = Struct.new(:timestamp, :nonce, :user_id, :v1)

    # Decodes a header value without checking it. Private, as Go's:
    # nothing in it is verified.
    def parse(header)
      h = header.to_s.b
      raise Missing, "signature header missing" if h.empty?

      ts = nonce = uid = nil
      v1 = []
      h.split(",", -1).each do |part|
        k, eq, v = part.gsub(WS, "").partition("=")
        raise Malformed, "signature header malformed" if eq.empty?

        case k
        when "t"
          raise Malformed, "signature header malformed" unless ts.nil?

          ts = int64(v)
        when "n"
          raise Malformed, "signature header malformed" if v.empty? || v.bytesize > 64 || !nonce.nil?

          nonce = v
        when "u"
          raise Malformed, "signature header malformed" unless uid.nil?

          uid = int64(v)
        when "v1"
          raise Malformed, "signature header malformed" unless HEX32.match?(v) && v1.size < 4

          v1 << [v].pack("H*")
        end
        # Unknown schemes are ignored, so a future v2 can sit beside v1.
      end
      raise Malformed, "signature header malformed" if ts.nil? || nonce.nil? || uid.nil? || v1.empty?

      Parsed.new(ts, nonce, uid, v1)
    end

    private_class_method :parse, :int64
    private_constant :Parsed

    def secure_compare(a, b)
      return false unless a.bytesize == b.bytesize

      if OpenSSL.respond_to?(:fixed_length_secure_compare)
        OpenSSL.fixed_length_secure_compare(a, b)
      else
        r = 0
        a.bytes.zip(b.bytes) { |x, y| r |= x ^ y }
        r.zero?
      end
    end

    def wall_clock
      Process.clock_gettime(Process::CLOCK_REALTIME)
    end

    # Nonces in this process's memory until they expire, by time, with no
    # capacity: for an API with one process, and tests. Replicas each have
    # their own; use PostgresNonceStore for more than one process.
    class MemoryNonceStore
      def initialize(clock: -> { ReplayAuth.wall_clock })
        @clock = clock
        @seen = {}
        @next_sweep = -Float::INFINITY
        @mutex = Mutex.new
      end

      # Records nonce until expires_at (unix seconds); false when it is
      # already recorded and not expired.
      def use(nonce, expires_at, now: nil)
        now ||= @clock.call
        @mutex.synchronize do
          if now >= @next_sweep
            @seen.delete_if { |_, exp| now > exp }
            @next_sweep = now + MEMORY_SWEEP_INTERVAL
          end
          exp = @seen[nonce]
          # Refused up to and including the instant it expires, the last
          # instant its signature still passes the window.
          return false if exp && now <= exp

          @seen[nonce] = expires_at
          true
        end
      end

      def size = @mutex.synchronize { @seen.size }
    end

    # The row count a query callable returned: an Integer, or a result
    # with cmd_tuples (ruby-pg's PG::Result).
    def rows(result)
      return result if result.is_a?(Integer)
      return Integer(result.cmd_tuples) if result.respond_to?(:cmd_tuples)

      raise TypeError, "idemd replay_auth: the query callable must return the number of rows, got #{result.class}"
    end

    # The statements of idem.ReplayNonces and idem.ReplayAuth.
    INSERT_NONCE_SQL = "INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ($1, to_timestamp($2)) " \
                       "ON CONFLICT (nonce) DO NOTHING"
    CLEANUP_NONCES_SQL = "DELETE FROM idemd_replay_nonces WHERE ctid = ANY (ARRAY(" \
                         "SELECT ctid FROM idemd_replay_nonces " \
                         "WHERE expires_at < now() - make_interval(secs => $1) " \
                         "ORDER BY expires_at LIMIT $2))"
    UNFINISHED_KEY_SQL = "SELECT 1 FROM idempotency_keys " \
                         "WHERE user_id = $1 AND idempotency_key = $2 AND recovery_point <> 'finished' " \
                         "AND upper(request_method) = upper($3) AND request_path = $4 LIMIT 1"

    # Logs the first failure of a run and the first success after it.
    class Outage
      def initialize
        @down = false
        @failed = 0
        @mutex = Mutex.new
      end

      def fail(logger, msg, err)
        first = @mutex.synchronize do
          @failed += 1
          was = @down
          @down = true
          !was
        end
        logger.error("#{msg}: #{err.message}") if first
      end

      def ok(logger, msg)
        was, n = @mutex.synchronize do
          r = [@down, @failed]
          @down = false
          @failed = 0
          r
        end
        logger.info("#{msg} (failures: #{n})") if was
      end
    end

    # Nonces in idemd's table idemd_replay_nonces, shared by every replica
    # of the API in any language (idem.ReplayNonces in Go): a nonce accepted
    # by one is refused by all.
    #
    # query.call(sql, params) runs one statement on the application's driver
    # outside any transaction of the request and returns the number of rows
    # (an Integer, or a PG::Result). With ruby-pg:
    #
    #   query = ->(sql, params) { DB_POOL.with { |c| c.exec_params(sql, params) } }
    #
    # Recording is one INSERT ... ON CONFLICT (nonce) DO NOTHING with
    # expires_at = the signature's timestamp + the skew window; after a use,
    # at most once per cleanup_interval, up to cleanup_batch rows expired for
    # longer than grace (database clock) are deleted, and again on the next
    # use while batches come back full. A failed insert raises (the verifier
    # refuses with 503); a failed cleanup is logged once per outage.
    class PostgresNonceStore
      attr_reader :use_errors, :cleanup_errors, :deleted, :cleanup_batch

      def initialize(query, cleanup_interval: 60.0, cleanup_batch: 1000, grace: 60.0,
                     clock: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }, logger: nil)
        @query = query
        @interval = cleanup_interval.positive? ? cleanup_interval : 60.0
        @cleanup_batch = cleanup_batch.positive? ? Integer(cleanup_batch) : 1000
        @grace = grace.positive? ? grace.to_f : 60.0
        @clock = clock
        @logger = logger || Logger.new($stderr)
        @mutex = Mutex.new
        @next_clean = -Float::INFINITY
        @cleaning = false
        @down = Outage.new
        @use_errors = 0
        @cleanup_errors = 0
        @deleted = 0
      end

      def use(nonce, expires_at)
        n = begin
          ReplayAuth.rows(@query.call(INSERT_NONCE_SQL, [nonce, Integer(expires_at)]))
        rescue StandardError
          @mutex.synchronize { @use_errors += 1 }
          raise
        end
        maybe_cleanup
        n == 1
      end

      # Deletes up to cleanup_batch rows expired for longer than grace;
      # returns how many.
      def cleanup
        ReplayAuth.rows(@query.call(CLEANUP_NONCES_SQL, [@grace, @cleanup_batch]))
      end

      private

      def maybe_cleanup
        now = @clock.call
        due = @mutex.synchronize do
          next false if now < @next_clean || @cleaning

          @cleaning = true
        end
        return unless due

        deleted = 0
        err = nil
        begin
          deleted = cleanup
        rescue StandardError => e
          err = e
        end
        @mutex.synchronize do
          @cleaning = false
          @next_clean = err.nil? && deleted >= @cleanup_batch ? now : now + @interval
          if err
            @cleanup_errors += 1
          else
            @deleted += deleted
          end
        end
        if err
          @down.fail(@logger, "idemd replay_auth: deleting expired replay nonces failed; retrying every cleanup interval", err)
        else
          @down.ok(@logger, "idemd replay_auth: deleting expired replay nonces works again")
        end
      end
    end

    # The middleware's second check (idem.ReplayAuth's): the signed user
    # has an existing, unfinished key with this value, stored for this same
    # method and path. query as for PostgresNonceStore.
    class PostgresKeyLookup
      def initialize(query)
        @query = query
      end

      def call(user_id, key, method, path)
        ReplayAuth.rows(@query.call(UNFINISHED_KEY_SQL, [user_id, key, method, path])).positive?
      end
    end

    # Checks signature headers (replayauth.Verifier).
    #
    # secrets: one, or two during a rotation (Strings or Secrets of at least
    # 32 bytes); a request signed with any of them is accepted. skew: the
    # window in seconds. nonce_store: nil keeps nonces in this process's
    # memory (one process only); PostgresNonceStore shares them with every
    # replica. clock: unix seconds (tests).
    class Verifier
      attr_reader :skew, :nonce_store

      def initialize(secrets, skew: DEFAULT_SKEW, nonce_store: nil, clock: -> { ReplayAuth.wall_clock })
        @secrets = ReplayAuth.secrets(secrets)
        @skew = skew&.positive? ? skew : DEFAULT_SKEW
        @nonce_store = nonce_store
        @clock = clock
        @memory = MemoryNonceStore.new(clock: clock)
      end

      # Returns the signed user id or raises a ReplayAuth::Error. The nonce
      # is recorded only after the MAC and the window check pass.
      def verify(header, method, path, key, body = "")
        parsed = ReplayAuth.send(:parse, header)
        k = key.to_s.b
        pa = path.to_s.b
        raise Malformed, "signature header malformed" if k.match?(/[\r\n]/n) || pa.match?(/[\r\n]/n)

        now = @clock.call
        d = now - parsed.timestamp
        raise Expired, "timestamp outside the skew window" if d > @skew || d < -@skew

        c = ReplayAuth.canonical(parsed.timestamp, parsed.nonce, method, pa, parsed.user_id, k, body)
        ok = false
        @secrets.each do |s|
          want = ReplayAuth.mac(s, c)
          # Every comparison runs: timing tells nothing about which secret
          # or signature matched.
          parsed.v1.each { |got| ok = ReplayAuth.secure_compare(want, got) | ok }
        end
        raise Mismatch, "no signature matches" unless ok

        nonce = parsed.nonce.dup.force_encoding(Encoding::UTF_8)
        fresh = begin
          if @nonce_store.nil?
            @memory.use(nonce, parsed.timestamp + @skew, now: now)
          else
            @nonce_store.use(nonce, parsed.timestamp + @skew)
          end
        rescue StandardError => e
          raise NonceStoreError, "nonce store unavailable: #{e.message}"
        end
        raise Replayed, "nonce already used" unless fresh

        parsed.user_id
      end
    end

    # idem.ValidateKey: present, UTF-8, at most 255 characters, no control
    # characters. Returns the key as a UTF-8 String.
    def validate_key(key)
      raise Refused, "Idempotency-Key header missing" if key.nil? || key.empty?

      s = key.dup.force_encoding(Encoding::UTF_8)
      raise Refused, "idempotency key has invalid characters" unless s.valid_encoding?
      raise Refused, "idempotency key too long" if s.length > MAX_KEY_LENGTH
      raise Refused, "idempotency key has invalid characters" if s.match?(/[\u0000-\u001f\u007f-\u009f]/)

      s
    end

    # Rack middleware (idem.ReplayAuth). A request without the signature
    # header passes through untouched, to the API's own authentication. A
    # signed one reaches the application only when the signature verifies
    # and unfinished_key.call(user_id, key, method, path) is true; the
    # application then finds the user id in env["idemd.replay_user_id"] and
    # the body, which the middleware read, in rack.input as before.
    #
    #   use Idemd::ReplayAuth::Middleware,
    #       verifier: Idemd::ReplayAuth::Verifier.new(secrets, nonce_store: store),
    #       unfinished_key: Idemd::ReplayAuth::PostgresKeyLookup.new(query)
    #
    # verifier: nil disables the replay path: every signed request gets 401.
    class Middleware
      def initialize(app, verifier:, unfinished_key:, logger: nil)
        if unfinished_key.nil?
          raise ArgumentError, "idemd replay_auth: unfinished_key is required (PostgresKeyLookup): " \
                               "a replay may only finish an existing unfinished key of the signed user"
        end

        @app = app
        @verifier = verifier
        @unfinished_key = unfinished_key
        @logger = logger || Logger.new($stderr)
        @nonce_down = Outage.new
      end

      def call(env)
        # Only this middleware sets the key (a client's headers become
        # HTTP_* keys and cannot).
        env.delete(USER_ID_KEY)
        header = env["HTTP_IDEMD_REPLAY_SIGNATURE"].to_s
        return @app.call(env) if header.empty?

        path = request_path(env)
        begin
          uid = verify(env, header, path)
        rescue Error => e
          return refusal(e, path)
        end
        env[USER_ID_KEY] = uid
        @app.call(env)
      end

      private

      def verify(env, header, path)
        raise Refused, "replay path disabled: no verifier configured" if @verifier.nil?
        raise Malformed, "request path is not valid percent-encoding" if path.nil?

        key = ReplayAuth.validate_key(env["HTTP_IDEMPOTENCY_KEY"].to_s.b)
        body = read_body(env)
        method = env["REQUEST_METHOD"].to_s
        begin
          uid = @verifier.verify(header, method, path, key, body)
        rescue Replayed
          answered
          raise
        end
        answered
        found = begin
          @unfinished_key.call(uid, key, method, path.dup.force_encoding(Encoding::UTF_8))
        rescue StandardError => e
          raise KeyLookupError, "replay key lookup: #{e.message}"
        end
        raise Refused, "no unfinished key of the signed user for this method and path" unless found

        uid
      end

      def answered
        @nonce_down.ok(@logger, "idemd replay_auth: recording replay nonces works again")
      end

      # The request's full path, percent-decoded as Go's r.URL.Path: from
      # REQUEST_URI when the server sets it (raw everywhere), else
      # SCRIPT_NAME + PATH_INFO. nil when an escape is invalid.
      def request_path(env)
        raw = env["REQUEST_URI"].to_s
        if raw.empty?
          raw = env["SCRIPT_NAME"].to_s + env["PATH_INFO"].to_s
        else
          raw = raw.sub(%r{\A[a-zA-Z][a-zA-Z0-9+.-]*://[^/]*}, "").split("?", 2).first.to_s
        end
        raw = raw.b
        return nil if raw.match?(/%(?![0-9a-fA-F]{2})/n)

        raw.gsub(/%([0-9a-fA-F]{2})/n) { Regexp.last_match(1).hex.chr }
      end

      def read_body(env)
        len = env["CONTENT_LENGTH"].to_s
        if !len.empty? && (!len.match?(/\A[0-9]+\z/) || Integer(len, 10) > MAX_REPLAY_BODY)
          raise Refused, "body too large or unreadable"
        end

        input = env["rack.input"]
        body = input ? input.read(MAX_REPLAY_BODY + 1).to_s.b : "".b
        raise Refused, "body too large or unreadable" if body.bytesize > MAX_REPLAY_BODY

        # The application reads the bytes the signature covered.
        env["rack.input"] = StringIO.new(body)
        env["CONTENT_LENGTH"] = body.bytesize.to_s
        body
      end

      def refusal(err, path)
        status, msg = case err
                      when NonceStoreError
                        @nonce_down.fail(@logger, "idemd replay_auth: cannot record replay nonces; signed " \
                                                  "replays are refused with 503 until it answers again", err)
                        [503, MSG_INTERNAL]
                      when KeyLookupError
                        @logger.error("idemd replay_auth: replay key lookup failed: #{err.message}")
                        [503, MSG_INTERNAL]
                      else
                        # The reason goes to the log, never to the caller.
                        @logger.warn("idemd replay_auth: replay signature rejected: path=#{path.inspect} " \
                                     "reason=#{err.message}")
                        [401, MSG_UNAUTHORIZED]
                      end
        body = JSON.generate({ "error" => msg })
        [status, { "content-type" => "application/json", "content-length" => body.bytesize.to_s }, [body]]
      end
    end
  end
end
