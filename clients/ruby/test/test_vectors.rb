# frozen_string_literal: true

require "helpers"
require "tmpdir"

RA = Idemd::ReplayAuth

class TestVectors < Minitest::Test
  ERRORS = {
    "missing" => RA::Missing, "malformed" => RA::Malformed, "expired" => RA::Expired,
    "mismatch" => RA::Mismatch, "replayed" => RA::Replayed
  }.freeze

  def test_vectors
    Helpers.vectors.each { |v| run_vector(v) }
  end

  def run_vector(v)
    name = v["name"]
    c = RA.canonical(v["timestamp"], v["nonce"], v["method"], v["path"], v["user_id"], v["idempotency_key"], v["body"])
    assert_equal v["canonical"].b, c, name
    assert_equal v["header"], RA.sign(v["secrets"], v["timestamp"], v["nonce"], v["method"], v["path"],
                                      v["user_id"], v["idempotency_key"], v["body"]), name
    clock = Helpers::Clock.new(0)
    ver = RA::Verifier.new(v["verifier_secrets"], skew: v["skew"], clock: clock)
    refute_empty v["steps"], name
    v["steps"].each_with_index do |st, i|
      clock.now = st["now"]
      r = st["request"]
      args = [st["header"], r["method"], r["path"], r["idempotency_key"], r["body"]]
      if st["expect"] == "ok"
        assert_equal st["user_id"], ver.verify(*args).to_s, "#{name}: step #{i}"
      else
        err = assert_raises(StandardError, "#{name}: step #{i}") { ver.verify(*args) }
        assert_instance_of ERRORS.fetch(st["expect"]), err, "#{name}: step #{i}: #{err.message}"
      end
    end
  end
end

class TestSecrets < Minitest::Test
  def test_short_secret_refused
    assert_raises(ArgumentError) { RA::Secret.new("short") }
  end

  def test_never_printed
    raw = "s" * 32
    s = RA::Secret.new(raw)
    refute_includes s.inspect + s.to_s + [s].inspect + "#{s}", raw
  end

  def test_read_secret_files
    Dir.mktmpdir do |d|
      p = File.join(d, "cur")
      File.write(p, "#{'a' * 32}\n")
      assert_equal 1, RA.read_secret_files(p, "", nil).size
      assert_raises(Errno::ENOENT) { RA.read_secret_files(File.join(d, "missing")) }
      assert_raises(ArgumentError) { RA.read_secret_files("") }
    end
  end
end

class TestMemory < Minitest::Test
  def test_expires_by_time_without_capacity
    clock = Helpers::Clock.new(1000.0)
    m = RA::MemoryNonceStore.new(clock: clock)
    20_000.times { |i| assert m.use("n#{i}", 1300.0) }
    refute m.use("n1", 1300.0)
    clock.now = 1300.0
    refute m.use("n2", 1600.0), "refused up to its expiry"
    clock.now = 1300.5
    assert m.use("n3", 1600.0), "expired: fresh again"
    clock.now = 1300.0 + RA::MEMORY_SWEEP_INTERVAL
    assert m.use("n4", 1600.0)
    assert_equal 2, m.size, "expired nonces swept"
  end

  def test_store_failure_fails_closed
    broken = Object.new
    def broken.use(_nonce, _expires_at) = raise(IOError, "database down")
    v = RA::Verifier.new("k" * 32, nonce_store: broken, clock: -> { 1_800_000_000 })
    h = RA.sign("k" * 32, 1_800_000_000, "n", "POST", "/x", 1, "key", "")
    err = assert_raises(RA::NonceStoreError) { v.verify(h, "POST", "/x", "key", "") }
    assert_equal 503, err.status
  end
end
