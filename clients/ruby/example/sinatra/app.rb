# frozen_string_literal: true

# A Sinatra + Sequel API shaped like the article's (form-encoded parameters,
# Sequel on ruby-pg), on idemd's schema contract: the framework-shaped
# companion of ../orders_api.rb, cut down to one phase. config.ru beside it
# mounts idemd's replay verifier; docs/languages/ruby.md walks through both.
#
# POST /orders with sku=book&quantity=2 (application/x-www-form-urlencoded),
# an Idempotency-Key and "Authorization: Bearer user-<id>" (a stand-in for
# the API's own authentication) claims the key, then in one phase inserts
# the order and finishes the key with the response. idemd's completer, run
# with --request-encoding form, replays an abandoned key as the same form
# body, signed; the middleware turns the signature into the user id.
#
# Two things an API that came from the article must do here, whatever the
# column's type (the article's JSONB or idemd's TEXT after `idemctl migrate
# --adopt-article-schema`): write response_body as a string it encoded
# itself, in an untyped parameter (not a Hash, which Sequel turns into SQL
# on a TEXT column), and read it back as response_body::text.
#
# Needs: sinatra, sequel and pg (Debian: ruby-sinatra, ruby-sequel,
# ruby-pg), and idemd-replayauth (../../lib, or the gem built from
# ../../idemd-replayauth.gemspec). Its table, orders, is the API's own:
#   CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
#     key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL);

require "digest"
require "json"
require "securerandom"
require "sequel"
require "sinatra/base"
require "idemd/replay_auth"

DB = Sequel.connect(ENV.fetch("DATABASE_URL"), max_connections: 10)

module OrdersApp
  LOCK_TIMEOUT = 90 # seconds: the completer's --lock-timeout
  MSG_PARAMS_MISMATCH = "There was a mismatch between this request's parameters and the parameters " \
                        "of a previously stored request with the same Idempotency-Key."
  MSG_IN_PROGRESS = "An API request with the same Idempotency-Key is already in progress."
  MSG_CONFLICT = "Conflict detected with a concurrent request. Please retry with the same Idempotency-Key."

  module_function

  # One autocommitted statement on a connection of Sequel's pool: the
  # query callable of the replay verifier's nonce store and key lookup.
  # Sequel's postgres adapter hands out PG::Connection objects.
  def query(sql, params)
    DB.synchronize { |c| c.exec_params(sql, params) }
  end

  # The validated parameters, typed: the form's strings become what the
  # JSON would have carried, so the replay (the stored params, form-encoded
  # by the completer) validates to the same canonical bytes.
  def validate(form)
    sku = form["sku"].to_s
    qty = Integer(form["quantity"].to_s, 10, exception: false)
    return nil unless sku.length.between?(1, 100) && qty&.between?(1, 100)

    { "quantity" => qty, "sku" => sku }
  end

  def canonical(params) = JSON.generate(params.sort.to_h)

  def fingerprint(method, path, canon)
    Digest::SHA256.hexdigest(["idemd-fp-v1", method.upcase, path, canon].join("\n"))
  end

  # Claims the key (docs/languages/ruby.md, "Begin"): a new key, an
  # existing unfinished and unlocked one, or a finished one to replay.
  def begin_key(user_id, key, path, canon, fp)
    4.times do
      r = query(<<~SQL, [key, user_id, path, canon, fp, SecureRandom.uuid]).values.first
        INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at, request_method,
                                      request_path, request_params, request_fingerprint, recovery_point,
                                      upstream_idempotency_key)
        VALUES ($1, $2, now(), now(), 'POST', $3, $4::jsonb, $5, 'started', $6)
        ON CONFLICT (user_id, idempotency_key) DO NOTHING
        RETURNING id, locked_at
      SQL
      return { id: r[0], locked_at: r[1] } if r

      # response_body::text: the same text whether the column is the
      # article's JSONB or idemd's TEXT.
      r = query(<<~SQL, [user_id, key, LOCK_TIMEOUT]).values.first
        SELECT id, recovery_point, request_fingerprint, response_code, response_body::text,
               locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => $3)
        FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2
      SQL
      next if r.nil?

      id, point, stored_fp, code, body, locked = r
      return [422, MSG_PARAMS_MISMATCH] if stored_fp && stored_fp != fp
      return { finished: [Integer(code), body] } if point == "finished"
      return [409, MSG_IN_PROGRESS] if locked == "t"

      r = query(<<~SQL, [id, fp, SecureRandom.uuid, LOCK_TIMEOUT]).values.first
        UPDATE idempotency_keys SET locked_at = now(), last_run_at = now(),
               request_fingerprint = COALESCE(request_fingerprint, $2),
               upstream_idempotency_key = COALESCE(upstream_idempotency_key, $3)
        WHERE id = $1 AND recovery_point <> 'finished'
          AND (locked_at IS NULL OR locked_at <= now() - make_interval(secs => $4))
        RETURNING id, locked_at
      SQL
      return { id: r[0], locked_at: r[1] } if r
    end
    [409, MSG_CONFLICT]
  end

  # The one phase: the key row locked and checked to be still this
  # request's, the order inserted, the key finished with the response, in
  # one transaction. Returns [status, body], or nil when the lock was lost.
  def create_order(k, user_id, params)
    DB.transaction do |c| # Sequel yields its PG::Connection
      held = c.exec_params("SELECT locked_at = $1 FROM idempotency_keys WHERE id = $2 FOR UPDATE",
                           [k[:locked_at], k[:id]]).values.dig(0, 0)
      raise Sequel::Rollback unless held == "t"

      order_id = c.exec_params(<<~SQL, [user_id, k[:id], params["sku"], params["quantity"]]).getvalue(0, 0)
        INSERT INTO orders (user_id, key_id, sku, quantity) VALUES ($1, $2, $3, $4) RETURNING id
      SQL
      # The body is encoded here, once, and stored as those bytes: an
      # untyped parameter, so PostgreSQL takes it on JSONB and on TEXT.
      body = JSON.generate(order_id: Integer(order_id), sku: params["sku"], quantity: params["quantity"])
      n = c.exec_params(<<~SQL, [k[:id], k[:locked_at], body]).cmd_tuples
        UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished',
               response_code = 201, response_body = $3
        WHERE id = $1 AND locked_at = $2
      SQL
      raise Sequel::Rollback unless n == 1

      [201, body]
    end
  rescue StandardError
    query("UPDATE idempotency_keys SET locked_at = NULL WHERE id = $1 AND locked_at = $2", [k[:id], k[:locked_at]])
    raise
  end
end

class OrdersAPI < Sinatra::Base
  set :show_exceptions, false
  set :raise_errors, false

  error do
    [500, { "content-type" => "application/json" }, JSON.generate(error: Idemd::ReplayAuth::MSG_INTERNAL)]
  end

  helpers do
    # The replay path first: the middleware set the signed user's id.
    def current_user_id
      env[Idemd::ReplayAuth::USER_ID_KEY] || request.env["HTTP_AUTHORIZATION"].to_s[/\ABearer user-(\d+)\z/, 1]&.to_i
    end

    # A stored or new response: its bytes as they are.
    def reply(status, body) = halt(status, { "content-type" => "application/json" }, body)

    def refuse(status, message) = reply(status, JSON.generate(error: message))
  end

  post "/orders" do
    uid = current_user_id or refuse(401, "Authentication required.")
    key = request.env["HTTP_IDEMPOTENCY_KEY"].to_s
    refuse(400, "Please specify an idempotency key with the Idempotency-Key header.") if key.empty? || key.length > 255
    params = OrdersApp.validate(request.POST) or refuse(422, "sku (1 to 100 characters) and quantity (1 to 100) are required.")
    canon = OrdersApp.canonical(params)
    path = request.script_name + request.path_info # the full path, as the completer signs it
    k = OrdersApp.begin_key(uid, key, path, canon, OrdersApp.fingerprint("POST", path, canon))
    refuse(*k) if k.is_a?(Array)
    if k[:finished]
      headers "idempotent-replayed" => "true"
      reply(*k[:finished])
    end
    reply(*(OrdersApp.create_order(k, uid, params) || refuse(409, OrdersApp::MSG_CONFLICT)))
  end
end
