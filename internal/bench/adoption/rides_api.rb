# frozen_string_literal: true

# The article's Rocket Rides API ("Implementing Stripe-like Idempotency Keys
# in Postgres"), written again on Sinatra + Sequel and adopted as
# docs/languages/ruby.md says: idemd's replay middleware mounted in front,
# the replay's signed user taken first. What the article does is kept as it
# is, because that is what the measurement is about:
#
#   - form-encoded parameters (request.POST), validated to Floats;
#   - every phase, Begin included, in a SERIALIZABLE transaction:
#     started -> ride_created -> charge_created -> finished;
#   - a serialization failure answered 409 at once (no retry inside), and a
#     parameter mismatch answered 409 too;
#   - the key unlocked when a phase fails.
#
# The charge goes to a fake Stripe: a ledger table written on its own
# connection, outside the phase's transaction (an upstream is not rolled
# back), that returns the existing charge for an idempotency key it has
# seen, as Stripe does. Every request that carries a replay signature is
# logged to adoption_replays with its status, after it is answered: the
# API's own count of the completer's replays.
#
#   ruby rides_api.rb   with DATABASE_URL, IDEMD_REPLAY_SECRET_FILE, PORT

require "json"
require "logger"
require "securerandom"
require "sequel"
require "sinatra/base"
require "rack"
require "rack/handler/webrick"
require "idemd/replay_auth"

DB = Sequel.connect(ENV.fetch("DATABASE_URL"), max_connections: 24)

module Rides
  LOCK_TIMEOUT = 90 # seconds: the completer's --lock-timeout
  MSG_MISMATCH = "There was a mismatch between this request's parameters and the parameters " \
                 "of a previously stored request with the same Idempotency-Key."
  MSG_IN_PROGRESS = "An API request with the same Idempotency-Key is already in progress."
  MSG_RETRY = "A conflict occurred with a concurrently executing request. Please retry."
  MSG_INTERNAL = "Internal server error."

  # What a phase block returns: move to a recovery point, or finish with a
  # response.
  RecoveryPoint = Struct.new(:name)
  Response = Struct.new(:status, :body)

  # Halts a request with status and body (thrown through the phase).
  class Halt < StandardError
    attr_reader :status, :body

    def initialize(status, body)
      super("halt #{status}")
      @status = status
      @body = body
    end
  end

  module_function

  def query(sql, params)
    DB.synchronize { |c| c.exec_params(sql, params) }
  end

  def error_body(message) = JSON.generate(error: { message: message })

  # The article's validation: four coordinates, as Floats.
  def validate(form)
    out = {}
    %w[origin_lat origin_lon target_lat target_lon].each do |name|
      v = Float(form[name].to_s, exception: false)
      raise Halt.new(422, error_body("Parameter #{name} must be a number.")) if v.nil?

      out[name] = v
    end
    out
  end

  # One phase: a SERIALIZABLE transaction around the block, whose result
  # moves the key on. A serialization failure is a 409 at once, as in the
  # article; any failure unlocks the key so that a retry need not wait.
  def atomic_phase(key_id)
    failed = true
    result = nil
    DB.transaction(isolation: :serializable) do
      DB.synchronize do |c|
        ret = yield c
        case ret
        when RecoveryPoint
          c.exec_params("UPDATE idempotency_keys SET recovery_point = $2 WHERE id = $1", [key_id.call, ret.name])
        when Response
          c.exec_params(<<~SQL, [key_id.call, ret.status, ret.body])
            UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished',
                   response_code = $2, response_body = $3
            WHERE id = $1
          SQL
          result = ret
        when nil
          nil
        else
          raise ArgumentError, "phase returned #{ret.inspect}"
        end
      end
    end
    failed = false
    result
  rescue Sequel::SerializationFailure, PG::TRSerializationFailure, Sequel::DatabaseError => e
    raise Halt.new(500, error_body(MSG_INTERNAL)) unless serialization_failure?(e)

    raise Halt.new(409, error_body(MSG_RETRY))
  rescue Halt
    raise
  rescue StandardError => e
    warn "phase failed: #{e.class}: #{e.message}"
    raise Halt.new(500, error_body(MSG_INTERNAL))
  ensure
    if failed && key_id.call
      begin
        query("UPDATE idempotency_keys SET locked_at = NULL WHERE id = $1", [key_id.call])
      rescue StandardError => e
        warn "failed to unlock key #{key_id.call}: #{e.message}"
      end
    end
  end

  def serialization_failure?(err)
    return true if err.is_a?(Sequel::SerializationFailure) || err.is_a?(PG::TRSerializationFailure)

    cause = err.respond_to?(:wrapped_exception) ? err.wrapped_exception : err.cause
    cause.is_a?(PG::TRSerializationFailure) || cause.is_a?(PG::TRDeadlockDetected)
  end

  # The fake Stripe: one charge per idempotency key (the ride's), on its own
  # connection, committed whatever the caller's transaction does.
  def stripe_charge(upstream_key, amount, customer)
    query(<<~SQL, [upstream_key, amount, customer]).getvalue(0, 0)
      WITH ins AS (
        INSERT INTO adoption_stripe_charges (upstream_key, amount, customer) VALUES ($1, $2, $3)
        ON CONFLICT (upstream_key) DO UPDATE SET calls = adoption_stripe_charges.calls + 1
        RETURNING id
      ) SELECT 'ch_' || id FROM ins
    SQL
  end

  # POST /rides: the article's handler, phase by phase.
  def create_ride(user_id, key_val, params)
    key = nil
    key_id = -> { key && key[:id] }
    canon = JSON.generate(params.sort.to_h)

    # Begin: find or create the key, in its own SERIALIZABLE transaction.
    atomic_phase(key_id) do |c|
      row = c.exec_params(<<~SQL, [user_id, key_val, canon]).first
        SELECT id, recovery_point, locked_at > now() - make_interval(secs => #{LOCK_TIMEOUT}) AS locked,
               request_params = $3::jsonb AS same_params, response_code, response_body::text AS response_body
        FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2
      SQL
      if row
        raise Halt.new(409, error_body(MSG_MISMATCH)) unless row["same_params"] == "t"
        raise Halt.new(409, error_body(MSG_IN_PROGRESS)) if row["locked"] == "t"

        if row["recovery_point"] != "finished"
          c.exec_params("UPDATE idempotency_keys SET last_run_at = now(), locked_at = now() WHERE id = $1", [row["id"]])
        end
        key = { id: row["id"], point: row["recovery_point"], code: row["response_code"], body: row["response_body"] }
      else
        id = c.exec_params(<<~SQL, [key_val, user_id, canon]).getvalue(0, 0)
          INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at, request_method,
                                        request_path, request_params, recovery_point)
          VALUES ($1, $2, now(), now(), 'POST', '/rides', $3::jsonb, 'started')
          RETURNING id
        SQL
        key = { id: id, point: "started" }
      end
      nil
    end

    loop do
      case key[:point]
      when "started"
        atomic_phase(key_id) do |c|
          ride_id = c.exec_params(<<~SQL, [key[:id], user_id, *params.values_at("origin_lat", "origin_lon", "target_lat", "target_lon")]).getvalue(0, 0)
            INSERT INTO adoption_rides (idempotency_key_id, user_id, origin_lat, origin_lon, target_lat, target_lon)
            VALUES ($1, $2, $3, $4, $5, $6) RETURNING id
          SQL
          c.exec_params(<<~SQL, [user_id, ride_id, canon])
            INSERT INTO adoption_audit_records (action, data, resource_id, resource_type, user_id)
            VALUES ('created', $3::jsonb, $2, 'ride', $1)
          SQL
          RecoveryPoint.new("ride_created")
        end
        key[:point] = "ride_created"
      when "ride_created"
        atomic_phase(key_id) do |c|
          ride_id = c.exec_params("SELECT id FROM adoption_rides WHERE idempotency_key_id = $1", [key[:id]]).getvalue(0, 0)
          charge = stripe_charge("rocket-rides-ride-#{ride_id}", 20_00, "cus_#{user_id}")
          c.exec_params("UPDATE adoption_rides SET stripe_charge_id = $2 WHERE id = $1", [ride_id, charge])
          RecoveryPoint.new("charge_created")
        end
        key[:point] = "charge_created"
      when "charge_created"
        res = atomic_phase(key_id) do |c|
          c.exec_params(<<~SQL, [JSON.generate(user_id: Integer(user_id))])
            INSERT INTO staged_jobs (job_name, job_args) VALUES ('send_ride_receipt', $1::jsonb)
          SQL
          Response.new(201, JSON.generate(wrapped_message: "Payment accepted. Your pilot is on their way!"))
        end
        return [res.status, res.body]
      when "finished"
        return [Integer(key[:code]), key[:body]]
      else
        raise Halt.new(500, error_body("Bug! Unhandled recovery point '#{key[:point]}'."))
      end
    end
  end
end

class RidesAPI < Sinatra::Base
  set :show_exceptions, false
  set :raise_errors, false

  error do
    [500, { "content-type" => "application/json" }, Rides.error_body(Rides::MSG_INTERNAL)]
  end

  get "/healthz" do
    "ok"
  end

  post "/rides" do
    content_type :json
    # The replay path first (docs/languages/ruby.md): the signed user.
    uid = env[Idemd::ReplayAuth::USER_ID_KEY] || request.env["HTTP_AUTHORIZATION"].to_s[/\ABearer user-(\d+)\z/, 1]&.to_i
    halt 401, Rides.error_body("Authentication required.") unless uid
    key = request.env["HTTP_IDEMPOTENCY_KEY"].to_s
    halt 400, Rides.error_body("Please specify an Idempotency-Key.") if key.empty? || key.length > 100
    begin
      status, body = Rides.create_ride(uid, key, Rides.validate(request.POST))
      [status, body]
    rescue Rides::Halt => e
      [e.status, e.body]
    end
  end
end

# Counts the completer's replays at the API: every request that carries a
# replay signature, with the status it was answered.
class ReplayLog
  def initialize(app) = @app = app

  def call(env)
    status, headers, body = @app.call(env)
    if env["HTTP_IDEMD_REPLAY_SIGNATURE"]
      Rides.query("INSERT INTO adoption_replays (idempotency_key, status) VALUES ($1, $2)",
                  [env["HTTP_IDEMPOTENCY_KEY"].to_s, status])
    end
    [status, headers, body]
  end
end

if $PROGRAM_NAME == __FILE__
  query = ->(sql, params) { Rides.query(sql, params) }
  verifier = Idemd::ReplayAuth::Verifier.new(
    Idemd::ReplayAuth.read_secret_files(ENV.fetch("IDEMD_REPLAY_SECRET_FILE"), nil),
    nonce_store: Idemd::ReplayAuth::PostgresNonceStore.new(query)
  )
  app = Rack::Builder.new do
    use ReplayLog
    use Idemd::ReplayAuth::Middleware,
        verifier: verifier,
        unfinished_key: Idemd::ReplayAuth::PostgresKeyLookup.new(query),
        logger: Logger.new($stderr)
    run RidesAPI
  end
  Rack::Handler::WEBrick.run(app, Host: "127.0.0.1", Port: Integer(ENV.fetch("PORT")),
                                  Logger: WEBrick::Log.new($stderr, WEBrick::Log::WARN), AccessLog: [])
end
