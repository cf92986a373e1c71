# frozen_string_literal: true

# Runs every test: ruby -Ilib -Itest test/all.rb (clients' Go TestRuby does).
Dir[File.join(__dir__, "test_*.rb")].sort.each { |f| require f }
