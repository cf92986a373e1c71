# idemd — see README.md. Every target works on a fresh machine of this kind:
# scripts/ensure-postgres.sh starts (or installs) PostgreSQL when needed.
GO      ?= go
BIN     := bin
CMDS    := enqueuer completer reaper idemctl
PKGS    := ./...

.PHONY: build test lint demo bench deploy-check clean ensure-postgres

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

ensure-postgres:
	@scripts/ensure-postgres.sh

# Tests run against a real PostgreSQL (internal/dbtest). -p 2: the machine has
# two cores and the heavy tests are database-bound.
test: ensure-postgres
	$(GO) test -count=1 -p 2 -timeout 30m $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

bench: ensure-postgres
	$(GO) run ./internal/benchreport/cmd -out bench-report.txt

demo: ensure-postgres build
	@scripts/demo.sh

deploy-check:
	@scripts/deploy-check.sh

clean:
	rm -rf $(BIN) bench-report.txt
