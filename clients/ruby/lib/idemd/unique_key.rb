# frozen_string_literal: true

# River's unique key for a job staged with plain SQL (docs/languages/README.md,
# "Unique jobs from another language"): the staged row's unique_key is the
# SHA-256 of the string River's Go client builds from the job's kind, args,
# period and queue, and unique_states the bitmask of the states in which an
# existing job counts as the same job. Computed here exactly as River's Go
# client does (Go's encoding/json for the args, Go's time.Truncate for the
# period), so a job staged from Ruby and the same job inserted by a Go API
# with River's InsertTx are one job. clients/testdata/unique_keys.json holds
# the vectors; River's own Ruby client (riverqueue gem) differs for args with
# & < >, U+2028, floats like 1.0, and for periods not dividing a day.
#
#   key = Idemd::UniqueKey.unique_key(kind: "send_invoice", args: args, queue: "billing",
#                                     by_args: true, fields: %w[customer_id month], by_period: 3600)
#   db.exec_params("INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states)
#                   VALUES ($1, $2, 'billing', $3, $4::bit(8))",
#                  ["send_invoice", JSON.generate(args), { value: key, format: 1 },
#                   Idemd::UniqueKey.unique_states])

require "digest"

module Idemd
  module UniqueKey
    # Seconds from Go's zero time (January 1, year 1, UTC), which
    # time.Truncate counts periods from, to the Unix epoch.
    GO_ZERO_TO_UNIX = 62_135_596_800

    # River's job states, in the order PostgreSQL prints unique_states
    # (bit 7 first).
    STATE_BITS = %w[scheduled running retryable pending discarded completed cancelled available].freeze
    DEFAULT_STATES = %w[available completed pending retryable running scheduled].freeze
    REQUIRED_STATES = %w[available pending running scheduled].freeze

    module_function

    # The 32-byte binary key for staged_jobs.unique_key. args is the job's
    # args as Go's API encodes its args struct (string keys or symbols;
    # values nil, true, false, Integer, Float, String, Array, Hash); fields
    # are the paths ("customer.id") of the fields marked river:"unique", or
    # nil for all args; by_period is whole seconds; at is the job's
    # scheduled_at or the insert's now.
    def unique_key(**opts)
      Digest::SHA256.digest(key_string(**opts))
    end

    # The string unique_key hashes.
    def key_string(kind:, args: {}, queue: "default", by_args: false, fields: nil, by_period: nil,
                   by_queue: false, exclude_kind: false, at: nil)
      if exclude_kind && !by_args && !by_period && !by_queue
        raise ArgumentError, "exclude_kind requires by_args, by_queue or by_period"
      end

      s = +""
      s << "&kind=" << kind.to_s unless exclude_kind
      s << "&args=" << unique_args(args, fields) if by_args
      s << "&period=" << period_start(at || Time.now, by_period) if by_period
      s << "&queue=" << queue.to_s if by_queue
      s
    end

    # unique_states as a bit string for a bit(8) parameter: River's default
    # (every state but cancelled and discarded) when states is nil.
    def unique_states(states = nil)
      states = (states || DEFAULT_STATES).map(&:to_s)
      unknown = states - STATE_BITS
      raise ArgumentError, "unknown job states: #{unknown.join(', ')}" unless unknown.empty?

      missing = REQUIRED_STATES - states
      raise ArgumentError, "unique states must contain #{missing.join(', ')}" unless missing.empty?

      STATE_BITS.map { |st| states.include?(st) ? "1" : "0" }.join
    end

    # The args part: with fields, the marked fields in sorted path order,
    # nested as in the args; without, every top-level key sorted by bytes.
    def unique_args(args, fields)
      raise ArgumentError, "args must be a Hash" unless args.is_a?(Hash)

      args = args.transform_keys(&:to_s)
      return object_json(args.sort_by { |k, _| k.b }) if fields.nil? || fields.empty?

      picked = PickedHash.new
      fields.map(&:to_s).sort_by(&:b).each do |path|
        parts = path.split(".")
        found, value = dig(args, parts)
        next unless found

        node = picked
        parts[0..-2].each { |p| node = (node[p] ||= PickedHash.new) }
        node[parts.last] = value
      end
      picked_json(picked)
    end

    def dig(obj, parts)
      parts.each do |p|
        return [false, nil] unless obj.is_a?(Hash)

        h = obj.transform_keys(&:to_s)
        return [false, nil] unless h.key?(p)

        obj = h[p]
      end
      [true, obj]
    end

    def picked_json(node)
      "{" + node.map do |k, v|
        "#{top_key(k)}:#{v.is_a?(PickedHash) ? picked_json(v) : go_json(v)}"
      end.join(",") + "}"
    end

    # Marks the objects unique_args builds (keys of marked paths) apart
    # from Hash values taken whole from the args.
    class PickedHash < Hash; end

    def object_json(pairs)
      "{" + pairs.map { |k, v| "#{top_key(k)}:#{go_json(v)}" }.join(",") + "}"
    end

    # A top-level key as River writes it: between quotes as it is when all
    # of it is printable ASCII other than " and \, else as Go encodes a
    # string.
    def top_key(key)
      key = key.to_s
      return "\"#{key}\"" if key.bytes.all? { |b| b >= 0x20 && b <= 0x7f && b != 0x22 && b != 0x5c }

      go_string(key)
    end

    # value as Go's encoding/json.Marshal writes it.
    def go_json(value)
      case value
      when nil then "null"
      when true then "true"
      when false then "false"
      when Integer then value.to_s
      when Float then go_float(value)
      when String, Symbol then go_string(value.to_s)
      when Array then "[" + value.map { |v| go_json(v) }.join(",") + "]"
      when Hash then "{" + value.map { |k, v| "#{go_string(k.to_s)}:#{go_json(v)}" }.join(",") + "}"
      else raise TypeError, "#{value.class} has no JSON form here: convert it as the Go API's args struct encodes it"
      end
    end

    GO_ESCAPES = { "\"" => "\\\"", "\\" => "\\\\", "\b" => "\\b", "\f" => "\\f", "\n" => "\\n",
                   "\r" => "\\r", "\t" => "\\t", "<" => "\\u003c", ">" => "\\u003e", "&" => "\\u0026",
                   "\u2028" => "\\u2028", "\u2029" => "\\u2029" }.freeze

    # A string as Go encodes it: ", \, the control characters (\b \f \n \r
    # \t short, the rest \u00XX), < > & and U+2028, U+2029 escaped; the
    # rest as UTF-8.
    def go_string(str)
      s = str.encode(Encoding::UTF_8)
      raise ArgumentError, "string is not valid UTF-8: #{str.inspect}" unless s.valid_encoding?

      out = s.gsub(/["\\<>&\u2028\u2029\x00-\x1f]/) do |c|
        GO_ESCAPES[c] || format("\\u%04x", c.ord)
      end
      "\"#{out}\""
    end

    # A float as Go's float64 encodes it: the shortest digits that read
    # back as the same float, in plain decimal for 1e-6 <= |f| < 1e21 and
    # with an exponent outside it (1, 0.1, 1e+21, 1e-7, -0).
    def go_float(f)
      raise ArgumentError, "#{f} has no JSON form" if f.nan? || f.infinite?
      return (1.0 / f).negative? ? "-0" : "0" if f.zero?

      mant, exp = f.abs.to_s.split("e")
      int, frac = mant.split(".")
      digits = int + frac.to_s
      point = int.length + exp.to_i
      stripped = digits.sub(/\A0+/, "")
      point -= digits.length - stripped.length
      digits = stripped.sub(/0+\z/, "")
      sign = f.negative? ? "-" : ""
      abs = f.abs
      if abs < 1e-6 || abs >= 1e21
        x = point - 1
        m = digits.length > 1 ? "#{digits[0]}.#{digits[1..]}" : digits
        return "#{sign}#{m}e#{x.negative? ? '-' : '+'}#{x.negative? ? -x : format('%02d', x)}"
      end
      body = if point <= 0
               "0.#{'0' * -point}#{digits}"
             elsif point >= digits.length
               digits + ("0" * (point - digits.length))
             else
               "#{digits[0, point]}.#{digits[point..]}"
             end
      sign + body
    end

    # The start of the period at falls in, in UTC, as RFC 3339: Go's
    # Time.Truncate counts periods from its zero time, not from 1970, which
    # matters for periods that do not divide a day (a week starts on a
    # Monday).
    def period_start(at, period)
      raise ArgumentError, "by_period must be whole seconds, at least 1" unless period.is_a?(Integer) && period >= 1

      secs = at.to_r.floor
      start = ((secs + GO_ZERO_TO_UNIX).div(period) * period) - GO_ZERO_TO_UNIX
      Time.at(start).utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    end
  end
end
