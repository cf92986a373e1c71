# frozen_string_literal: true

# rackup clients/ruby/example/sinatra/config.ru (Puma, WEBrick): app.rb's
# Sinatra API behind idemd's replay verifier. docs/languages/ruby.md
# explains each part.
#
#   DATABASE_URL                        the API's database (its role is a member of idemd_api)
#   IDEMD_REPLAY_SECRET_FILE            the secret the completer signs with (--auth-secret-file)
#   IDEMD_REPLAY_SECRET_PREVIOUS_FILE   during a rotation, the other one
#
# The secret is optional where the app is loaded without one (specs,
# scripts, a console): the middleware is mounted all the same, with no
# verifier, and refuses every signed request with 401, so the replay path
# is closed rather than open. A deployment that runs the completer sets it.

$LOAD_PATH.unshift(File.expand_path("../../lib", __dir__)) # or: gem "idemd-replayauth", path: ...
require_relative "app"
require "logger"

query = ->(sql, params) { OrdersApp.query(sql, params) }
secret_file = ENV["IDEMD_REPLAY_SECRET_FILE"].to_s
verifier = unless secret_file.empty?
             Idemd::ReplayAuth::Verifier.new(
               Idemd::ReplayAuth.read_secret_files(secret_file, ENV["IDEMD_REPLAY_SECRET_PREVIOUS_FILE"]),
               nonce_store: Idemd::ReplayAuth::PostgresNonceStore.new(query)
             )
           end

logger = Logger.new($stderr)
logger.warn("IDEMD_REPLAY_SECRET_FILE is not set: the completer's signed replays are refused (401)") if verifier.nil?

# Before anything that reads the body: Sinatra parses the form after it.
# (Inside the app, `use Idemd::ReplayAuth::Middleware, ...` in the class
# body of OrdersAPI works the same.)
use Idemd::ReplayAuth::Middleware,
    verifier: verifier,
    unfinished_key: Idemd::ReplayAuth::PostgresKeyLookup.new(query),
    logger: logger
run OrdersAPI
