# frozen_string_literal: true

require "helpers"
require "time"
require "idemd/unique_key"

UK = Idemd::UniqueKey

# Every published unique-key vector (clients/testdata/unique_keys.json,
# held to River's own InsertTx by clients' Go tests).
class TestUniqueKey < Minitest::Test
  def test_vectors
    vs = Helpers.unique_vectors
    vs.each do |v|
      u = v["unique"]
      opts = { kind: v["kind"], args: v["args"], queue: v["queue"], by_args: u.fetch("by_args", false),
               fields: u["fields"], by_period: u["by_period"], by_queue: u.fetch("by_queue", false),
               exclude_kind: u.fetch("exclude_kind", false), at: Time.iso8601(v["at"]) }
      assert_equal v["key_string"], UK.key_string(**opts), v["name"]
      assert_equal [v["unique_key"]].pack("H*"), UK.unique_key(**opts), v["name"]
      assert_equal v["unique_states"], UK.unique_states(u["by_state"]), v["name"]
    end
  end

  def test_symbol_keys_are_the_string_keys
    sym = UK.key_string(kind: "k", by_args: true, args: { b: 1, a: { c: 2.0 } })
    assert_equal '&kind=k&args={"a":{"c":2},"b":1}', sym
    assert_equal sym, UK.key_string(kind: "k", by_args: true, args: { "b" => 1, "a" => { "c" => 2.0 } })
  end

  def test_refusals
    assert_raises(ArgumentError) { UK.unique_states(%w[available running]) }
    assert_raises(ArgumentError) { UK.key_string(kind: "k", exclude_kind: true) }
    assert_raises(ArgumentError) { UK.key_string(kind: "k", by_args: true, args: { "f" => Float::NAN }) }
    assert_raises(ArgumentError) { UK.key_string(kind: "k", by_period: 1.5, at: Time.now) }
    assert_raises(TypeError) { UK.key_string(kind: "k", by_args: true, args: { "t" => Time.now }) }
  end
end
