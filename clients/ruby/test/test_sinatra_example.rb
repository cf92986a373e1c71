# frozen_string_literal: true

require "helpers"
require "pg"
require "securerandom"
require "tmpdir"

# example/sinatra/config.ru, loaded as rackup loads it, against the
# database the Go side migrated: a signed form-encoded replay (what the
# completer sends with --request-encoding form) finishes an abandoned key, a
# forged one is refused, and without a secret the app still loads and
# refuses every signed request. clients' Go tests run it on idemd's schema
# (response_body TEXT) and on the article's (JSONB, before and after
# `idemctl migrate --adopt-article-schema`): the example's code is the same.
class TestSinatraExample < Minitest::Test
  RA = Idemd::ReplayAuth
  URL = ENV["IDEMD_TEST_DATABASE_URL"].to_s
  SECRET = "0123456789abcdef0123456789abcdef"
  FORGED = "an attacker's guess at the secret!"
  CONFIG = File.expand_path("../example/sinatra/config.ru", __dir__)
  USER = 42
  FORM = "quantity=2&sku=book" # the completer's form encoding of {"quantity":2,"sku":"book"}

  def setup
    skip "IDEMD_TEST_DATABASE_URL needed" if URL.empty?
    require "rack"
    require "rack/mock"
    @db = PG.connect(URL)
    @db.exec("SET client_min_messages = warning")
    if @db.exec("SELECT to_regclass('orders') IS NULL").getvalue(0, 0) == "t" # the article's test creates it
      @db.exec("CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, " \
               "key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL)")
    end
    @dir = Dir.mktmpdir
    File.write(File.join(@dir, "secret"), "#{SECRET}\n")
  end

  def teardown
    @db&.close
    FileUtils.remove_entry(@dir) if @dir
  end

  def app(secret_file)
    ENV["DATABASE_URL"] = URL
    ENV["IDEMD_REPLAY_SECRET_FILE"] = secret_file
    built = Rack::Builder.parse_file(CONFIG) # Rack 2: [app, options]; Rack 3: app
    built.is_a?(Array) ? built.first : built
  ensure
    ENV.delete("IDEMD_REPLAY_SECRET_FILE")
  end

  # A key a client began and abandoned before the phase: unlocked at
  # 'started', with the canonical params the completer replays.
  def abandoned_key
    key = "sinatra-#{SecureRandom.hex(8)}"
    canon = OrdersApp.canonical({ "quantity" => 2, "sku" => "book" })
    @db.exec_params(<<~SQL, [key, USER, canon, OrdersApp.fingerprint("POST", "/orders", canon)])
      INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at, request_method,
                                    request_path, request_params, request_fingerprint, recovery_point)
      VALUES ($1, $2, NULL, now() - interval '1 minute', 'POST', '/orders', $3::jsonb, $4, 'started')
    SQL
    key
  end

  def replay(app, key, secret)
    header = RA.sign(secret, Time.now.to_i, "rb-sinatra-#{SecureRandom.hex(8)}", "POST", "/orders", USER, key, FORM)
    Rack::MockRequest.new(app).post("/orders", "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                                               "HTTP_IDEMPOTENCY_KEY" => key,
                                               "HTTP_IDEMD_REPLAY_SIGNATURE" => header, input: FORM)
  end

  # TEXT on idemd's schema; JSONB on the article's before the adoption,
  # where stored bodies are the JSONB's text.
  def text_body?
    @db.exec("SELECT atttypid = 'text'::regtype FROM pg_attribute " \
             "WHERE attrelid = 'idempotency_keys'::regclass AND attname = 'response_body'").getvalue(0, 0) == "t"
  end

  # The stored body answers what the first response did: byte for byte on
  # TEXT, the same JSON on JSONB.
  def assert_same_body(want, got, msg)
    assert_equal JSON.parse(want), JSON.parse(got), msg
    assert_equal want, got, "#{msg} (TEXT: byte for byte)" if text_body?
  end

  def stored(key)
    @db.exec_params("SELECT recovery_point, response_code, response_body::text, " \
                    "(SELECT count(*) FROM orders o WHERE o.key_id = k.id) " \
                    "FROM idempotency_keys k WHERE user_id = $1 AND idempotency_key = $2", [USER, key]).values.first
  end

  def test_signed_form_replay_finishes_the_key
    a = app(File.join(@dir, "secret"))
    key = abandoned_key
    res = replay(a, key, SECRET)
    assert_equal 201, res.status, res.body
    doc = JSON.parse(res.body)
    assert_equal %w[book 2], [doc["sku"], doc["quantity"].to_s]
    point, code, body, orders = stored(key)
    assert_equal %w[finished 201 1], [point, code, orders]
    assert_same_body res.body, body, "the stored response"

    # The key is finished: another signed replay is refused (no unfinished
    # key), and the client's retry gets the stored response.
    assert_equal 401, replay(a, key, SECRET).status
    retry_res = Rack::MockRequest.new(a).post("/orders", "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                                                         "HTTP_IDEMPOTENCY_KEY" => key,
                                                         "HTTP_AUTHORIZATION" => "Bearer user-#{USER}", input: FORM)
    assert_equal [201, "true"], [retry_res.status, retry_res.headers["idempotent-replayed"]]
    assert_same_body res.body, retry_res.body, "the client's retry"
  end

  def test_forged_replay_is_refused
    a = app(File.join(@dir, "secret"))
    key = abandoned_key
    res = replay(a, key, FORGED)
    assert_equal [401, { "error" => RA::MSG_UNAUTHORIZED }], [res.status, JSON.parse(res.body)]
    assert_equal ["started", nil, nil, "0"], stored(key)
  end

  def test_loads_without_a_secret
    a = app("")
    key = abandoned_key
    res = replay(a, key, SECRET)
    assert_equal [401, { "error" => RA::MSG_UNAUTHORIZED }], [res.status, JSON.parse(res.body)], "no secret: the replay path is closed"
    assert_equal ["started", nil, nil, "0"], stored(key)
    # The API's own path works as before.
    own = "sinatra-#{SecureRandom.hex(8)}"
    res = Rack::MockRequest.new(a).post("/orders", "CONTENT_TYPE" => "application/x-www-form-urlencoded",
                                                   "HTTP_IDEMPOTENCY_KEY" => own,
                                                   "HTTP_AUTHORIZATION" => "Bearer user-#{USER}", input: FORM)
    assert_equal 201, res.status, res.body
    point, code, body, orders = stored(own)
    assert_equal %w[finished 201 1], [point, code, orders]
    assert_same_body res.body, body, "the stored response"
  end
end
