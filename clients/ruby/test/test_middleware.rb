# frozen_string_literal: true

require "helpers"
require "stringio"

# Idemd::ReplayAuth::Middleware answers as idem.ReplayAuth does.
class TestMiddleware < Minitest::Test
  RA = Idemd::ReplayAuth
  SECRET = "0123456789abcdef0123456789abcdef"
  OTHER = "an attacker's guess at the secret!"
  NOW = 1_800_000_000
  BODY = '{"quantity":2,"sku":"book"}'
  KEY = "order-key-0001"
  UNAUTHORIZED = { "error" => RA::MSG_UNAUTHORIZED }.freeze
  INTERNAL = { "error" => RA::MSG_INTERNAL }.freeze

  class Lookup
    attr_accessor :answer
    attr_reader :calls

    def initialize
      @answer = true
      @calls = []
    end

    def call(user_id, key, method, path)
      @calls << [user_id, key, method, path]
      raise @answer if @answer.is_a?(Exception)

      @answer
    end
  end

  class BrokenStore
    def use(_nonce, _expires_at) = raise(IOError, "database down")
  end

  def setup
    @seen = []
    @lookup = Lookup.new
    @clock = Helpers::Clock.new(NOW)
    @mw = middleware(RA::Verifier.new(SECRET, clock: @clock))
  end

  def middleware(verifier, logger: Helpers.quiet_logger)
    seen = @seen
    app = lambda do |env|
      seen << { user: env[RA::USER_ID_KEY], body: env["rack.input"].read }
      [200, { "content-type" => "text/plain" }, ["served"]]
    end
    RA::Middleware.new(app, verifier: verifier, unfinished_key: @lookup, logger: logger)
  end

  def signed(nonce, secret: SECRET, path: "/orders", user: 42, key: KEY, body: BODY)
    RA.sign(secret, NOW, nonce, "POST", path, user, key, body)
  end

  # A Rack env as a server builds it: binary header strings.
  def call(mw, header: nil, key: KEY, body: BODY, path: "/orders", script: "", uri: nil, extra: {})
    env = { "REQUEST_METHOD" => "POST", "SCRIPT_NAME" => script, "PATH_INFO" => path,
            "rack.input" => StringIO.new(body.b), "CONTENT_LENGTH" => body.bytesize.to_s }
    env["REQUEST_URI"] = uri if uri
    env["HTTP_IDEMD_REPLAY_SIGNATURE"] = header.b if header
    env["HTTP_IDEMPOTENCY_KEY"] = key.b if key
    env.merge!(extra)
    status, headers, body = mw.call(env)
    { status: status, headers: headers, body: body.to_a.join }
  end

  def assert_refused(out, status = 401, body = UNAUTHORIZED)
    assert_equal status, out[:status]
    assert_equal body, JSON.parse(out[:body])
    assert_equal "application/json", out[:headers]["content-type"]
    assert_equal out[:body].bytesize.to_s, out[:headers]["content-length"]
    assert_empty @seen, "the application was called"
  end

  def test_unsigned_passes_untouched
    out = call(@mw, extra: { RA::USER_ID_KEY => 7 })
    assert_equal 200, out[:status]
    assert_equal [{ user: nil, body: BODY }], @seen
    assert_empty @lookup.calls
  end

  def test_valid
    assert_equal 200, call(@mw, header: signed("v1"))[:status]
    assert_equal [{ user: 42, body: BODY }], @seen
    assert_equal [[42, KEY, "POST", "/orders"]], @lookup.calls
  end

  def test_mounted_under_a_prefix_signs_the_full_path
    assert_equal 200, call(@mw, header: signed("v2", path: "/api/orders"), script: "/api", path: "/orders")[:status]
    assert_equal "/api/orders", @lookup.calls[0][3]
  end

  def test_request_uri_percent_decoded
    out = call(@mw, header: signed("v3", path: "/orders/café", key: "clé-✓"), key: "clé-✓",
                    uri: "/orders/caf%C3%A9?expand=1", path: "/orders/caf%C3%A9")
    assert_equal 200, out[:status]
    assert_equal [[42, "clé-✓", "POST", "/orders/café"]], @lookup.calls
  end

  def test_invalid_percent_encoding
    assert_refused call(@mw, header: signed("v4"), uri: "/orders%zz")
  end

  def test_forged
    assert_refused call(@mw, header: signed("f1", secret: OTHER))
    # A forged header records nothing: the real one with its nonce passes.
    assert_equal 200, call(@mw, header: signed("f1"))[:status]
  end

  def test_tampered_body
    assert_refused call(@mw, header: signed("f2"), body: '{"quantity":3,"sku":"book"}')
  end

  def test_garbage
    assert_refused call(@mw, header: "hello")
  end

  def test_expired
    @clock.now = NOW + 301
    assert_refused call(@mw, header: signed("f3"))
  end

  def test_replayed
    h = signed("f4")
    assert_equal 200, call(@mw, header: h)[:status]
    @seen.clear
    assert_refused call(@mw, header: h)
  end

  def test_no_unfinished_key
    @lookup.answer = false
    assert_refused call(@mw, header: signed("k1"))
  end

  def test_key_lookup_fails
    @lookup.answer = IOError.new("database down")
    assert_refused call(@mw, header: signed("k2")), 503, INTERNAL
  end

  def test_nonce_store_fails
    mw = middleware(RA::Verifier.new(SECRET, nonce_store: BrokenStore.new, clock: @clock))
    assert_refused call(mw, header: signed("s1")), 503, INTERNAL
    assert_empty @lookup.calls
  end

  def test_nonce_store_outage_logged_once
    store = Class.new do
      attr_accessor :down

      def initialize
        @down = true
        @seen = {}
      end

      def use(nonce, _exp)
        raise IOError, "database down" if @down

        !@seen.key?(nonce) && (@seen[nonce] = true)
      end
    end.new
    log = StringIO.new
    mw = middleware(RA::Verifier.new(SECRET, nonce_store: store, clock: @clock), logger: Logger.new(log))
    3.times { |i| assert_equal 503, call(mw, header: signed("o#{i}"))[:status] }
    store.down = false
    assert_equal 200, call(mw, header: signed("o9"))[:status]
    assert_equal 200, call(mw, header: signed("o10"))[:status]
    lines = log.string.lines
    assert_equal 1, lines.count { |l| l.include?("ERROR") }, log.string
    assert_equal 1, lines.count { |l| l.include?("INFO") && l.include?("failures: 3") }, log.string
  end

  def test_disabled
    mw = middleware(nil)
    assert_refused call(mw, header: signed("d1"))
    assert_equal 200, call(mw)[:status], "unsigned requests still pass"
  end

  def test_bad_idempotency_keys
    [nil, "", "a\u0001b", "k" * 256, "tab\tkey", "\xff\xfe".b].each do |key|
      assert_refused call(@mw, header: signed("b-#{key.inspect}", key: key.to_s), key: key)
    end
    assert_equal 200, call(@mw, header: signed("b-255", key: "k" * 255), key: "k" * 255)[:status]
  end

  def test_body_too_large
    big = "x" * (RA::MAX_REPLAY_BODY + 1)
    assert_refused call(@mw, header: signed("l1", body: big), body: big)
    edge = "x" * RA::MAX_REPLAY_BODY
    assert_equal 200, call(@mw, header: signed("l2", body: edge), body: edge)[:status]
  end

  def test_lookup_is_required
    assert_raises(ArgumentError) { RA::Middleware.new(->(_) {}, verifier: nil, unfinished_key: nil) }
  end
end
