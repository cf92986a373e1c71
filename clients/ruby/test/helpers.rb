# frozen_string_literal: true

require "json"
require "logger"
require "time"
require "minitest/autorun"
require "idemd/replay_auth"

module Helpers
  VECTORS = ENV.fetch("IDEMD_VECTORS") do
    File.expand_path("../../../idem/replayauth/testdata/vectors.json", __dir__)
  end

  def self.vectors
    vs = JSON.parse(File.read(VECTORS, encoding: "UTF-8"))
    raise "expected the full vector set" unless vs.size > 10

    vs
  end

  UNIQUE_VECTORS = ENV.fetch("IDEMD_UNIQUE_VECTORS") do
    File.expand_path("../../testdata/unique_keys.json", __dir__)
  end

  def self.unique_vectors
    vs = JSON.parse(File.read(UNIQUE_VECTORS, encoding: "UTF-8"))
    raise "expected the full unique-key vector set" unless vs.size > 20

    vs
  end

  # A clock the tests set.
  class Clock
    attr_accessor :now

    def initialize(now)
      @now = now
    end

    def to_proc = -> { @now }
    def call = @now
  end

  # The middleware logs every refusal; the tests make many on purpose.
  def self.quiet_logger = Logger.new(IO::NULL)
end
