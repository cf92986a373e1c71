# frozen_string_literal: true

# The Ruby replay verifier as a gem, so Bundler installs it from a path or
# from git (docs/languages/ruby.md, "Installing the library"):
#
#   gem "idemd-replayauth", path: "vendor/idemd/clients/ruby"
#   gem "idemd-replayauth", git: "https://github.com/idemd/idemd", glob: "clients/ruby/*.gemspec"
#
# No dependencies beyond Ruby's standard library. The version is idemd's
# (VERSION at the repository's top; clients' TestPackages checks it).
Gem::Specification.new do |s|
  s.name = "idemd-replayauth"
  s.version = "0.2.0"
  s.summary = "idemd's replay signature verifier and Rack middleware"
  s.description = "Verifies the Idemd-Replay-Signature that idemd's completer signs its replays with, " \
                  "records nonces in idemd_replay_nonces, and mounts as Rack middleware."
  s.authors = ["The idemd authors"]
  s.homepage = "https://github.com/idemd/idemd"
  s.license = "Apache-2.0"
  s.files = ["lib/idemd/replay_auth.rb", "lib/idemd/unique_key.rb"]
  s.require_paths = ["lib"]
  s.required_ruby_version = ">= 3.0"
end
