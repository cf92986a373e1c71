# idemd — see README.md. Every target works on a fresh machine of this kind:
# scripts/ensure-postgres.sh starts (or installs) PostgreSQL when needed.
GO      ?= go
BIN     := bin
CMDS    := enqueuer completer reaper idemctl
PKGS    := ./...

.PHONY: build image release-snapshot test unit release-test race check fmt-check helm-test e2e lint demo bench soak deploy-check clean ensure-postgres ensure-promtool ensure-kustomize ensure-pgbouncer ensure-buildah ensure-runtimes ensure-chromium ensure-qemu

# Every binary carries its version (VERSION) and commit: --version prints
# them, idemd_build_info exports them (scripts/buildinfo.sh).
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$$(scripts/buildinfo.sh ldflags)" -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

ensure-postgres:
	@scripts/ensure-postgres.sh

# promtool checks and unit-tests the alerts (deploy/alerts_test.go).
ensure-promtool:
	@scripts/ensure-promtool.sh

# A kustomize v5 renderer for deploy/images_test.go: kubectl's, else the
# kustomize CLI built from the Go module proxy.
ensure-kustomize:
	@scripts/ensure-kustomize.sh

# internal/testing/pgbouncertest runs the tests' own pgbouncer processes.
ensure-pgbouncer:
	@scripts/ensure-pgbouncer.sh

# buildah builds the image offline; internal/testing/imagetest runs it with podman
# on runc.
ensure-buildah:
	@scripts/ensure-buildah.sh

# Debian's ruby, python3 and node for the other-language clients' tests
# (clients/, internal/testing/e2e/polyglot).
ensure-runtimes:
	@scripts/ensure-runtimes.sh

# Debian's chromium and chromedriver for the console's browser test
# (internal/console, TestBrowser; with CI=true it fails without them).
ensure-chromium:
	@scripts/ensure-chromium.sh

# qemu-user-static and its binfmt_misc handler: the release test runs the
# linux/arm64 binaries and image (internal/testing/releasetest).
ensure-qemu:
	@scripts/ensure-qemu.sh

# The container image, built offline (FROM scratch, nothing pulled) as
# $(IMAGE): an index of $(PLATFORMS), each also tagged $(IMAGE)-<arch>;
# deploy/Dockerfile builds the same image where a registry is reachable.
IMAGE ?= localhost/idemd:dev
PLATFORMS ?= linux/amd64 linux/arm64
image: ensure-buildah
	@PLATFORMS="$(PLATFORMS)" scripts/build-image.sh $(IMAGE)

# Every artifact of a release, offline, into dist/ and build/release/:
# binaries for linux and darwin on amd64 and arm64 with SBOMs, the image
# for both architectures, the client packages, checksums.txt
# (scripts/release.sh; the release workflow runs the same on a tag).
release-snapshot: ensure-buildah ensure-runtimes
	@scripts/release.sh snapshot

# Tests run against a real PostgreSQL (internal/testing/dbtest). -p 2: the machine has
# two cores and the heavy tests are database-bound. `make test` is the README's
# test command: the package tests, the release build and image tests, then the
# end-to-end fault suite. .ci/run runs the same targets as stages, each timed.
test:
	@scripts/stage.sh unit $(MAKE) unit
	@scripts/stage.sh release $(MAKE) release-test
	@scripts/stage.sh e2e $(MAKE) e2e

# Every package but the release build and the image (release-test).
UNIT_PKGS = $(shell $(GO) list ./... | grep -v -e /internal/testing/releasetest -e /internal/testing/imagetest)
RELEASE_PKGS := ./internal/testing/releasetest/ ./internal/testing/imagetest/

unit: ensure-postgres ensure-pgbouncer ensure-promtool ensure-kustomize ensure-runtimes ensure-chromium
	$(GO) test -count=1 -p 2 -timeout 30m $(UNIT_PKGS)
	$(MAKE) helm-test

# The release build (`make release-snapshot` with every artifact checked,
# the arm64 binaries and image run under qemu) and the image run with podman.
release-test: ensure-postgres ensure-buildah ensure-runtimes ensure-qemu
	$(GO) test -count=1 -p 1 -timeout 30m $(RELEASE_PKGS)

# The race detector over every package that runs goroutines: the services,
# lifecycle, lease, dbcred, dbstats, the operator core, the console and idem.
RACE_PKGS := ./internal/lifecycle/... ./internal/lease/ ./internal/dbcred/ ./internal/dbstats/ ./internal/operator/ \
	./internal/console/ ./idem/... ./internal/enqueuer/ ./internal/completer/ ./internal/reaper/... ./internal/testing/horizon/
race: ensure-postgres ensure-pgbouncer
	$(GO) test -race -count=1 -p 2 -timeout 30m $(RACE_PKGS)

# The loop before each commit: formatting, golangci-lint (govet among its
# linters, the e2e tag included; lint's separate go vet passes and the Helm
# module's stay in `make lint` and CI), and the tests of every product
# package (cmd, idem, internal and migrations: not the harness, the
# benchmarks, the end-to-end suite, the example API, the other-language
# clients or the manifests' tests, which `make unit` runs) against the local
# PostgreSQL, with no installer beyond PostgreSQL. Tests that need another
# tool skip here unless CI=true. docs/benchmarks/devloop.md has its times.
CHECK_PKGS = $(shell $(GO) list ./... | grep -v -e /internal/testing -e /internal/bench -e /examples/ -e /clients -e /deploy)
check: ensure-postgres fmt-check $(GOLANGCI)
	$(GOLANGCI) run ./...
	$(GO) test -count=1 -p 2 -timeout 15m $(CHECK_PKGS)

# The Helm chart's tests (deploy/helm/idemd rendered and linted with Helm's Go
# library, compared with the kustomize base). A module of its own, so that
# Helm's Kubernetes client libraries stay out of the main go.mod, which the
# idem package's users build against; `./...` above does not enter it.
helm-test:
	cd deploy/helm && $(GO) test -count=1 -timeout 10m ./...

# The end-to-end fault suite: real processes, SIGKILL, a PostgreSQL restart,
# severed connections, silent faults (internal/testing/e2e, build tag e2e).
# The silent faults last 20 s each here (60 s by default, as
# docs/benchmarks/faults.md measures them): the same recoveries, checked
# in a third of the time.
IDEMD_E2E_SILENCE ?= 20s
e2e: ensure-postgres ensure-pgbouncer ensure-promtool ensure-runtimes
	IDEMD_E2E_SILENCE=$(IDEMD_E2E_SILENCE) $(GO) test -tags e2e -count=1 -timeout 30m ./internal/testing/e2e/...

# golangci-lint, pinned in tools/lint/go.mod (a module of its own, so its
# dependencies stay out of the main go.mod and the release tools'), built
# once into bin/; its configuration is .golangci.yml.
GOLANGCI := $(BIN)/golangci-lint
$(GOLANGCI): tools/lint/go.mod tools/lint/go.sum
	@mkdir -p $(BIN)
	cd tools/lint && $(GO) build -o $(abspath $(GOLANGCI)) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

# Every tracked Go file gofmt'ed.
fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: fmt-check $(GOLANGCI)
	$(GO) vet $(PKGS)
	$(GO) vet -tags e2e ./internal/testing/e2e/...
	cd deploy/helm && $(GO) vet ./...
	$(GOLANGCI) run ./...

bench: ensure-postgres ensure-pgbouncer
	$(GO) run ./internal/bench/report/cmd -out bench-report.txt

# The soak (internal/testing/e2e/soak): Rocket Rides and the daemons under
# steady traffic on a private cluster for IDEMD_SOAK_DURATION (30m; 3m for a
# smoke check), then the oracle and the flatness checks, which fail it.
# Writes soak-report.txt and soak-samples.csv (docs/benchmarks/soak.md). Not
# part of `make test`: it is long.
IDEMD_SOAK_DURATION ?= 30m
soak: ensure-postgres
	IDEMD_SOAK=1 IDEMD_SOAK_DURATION=$(IDEMD_SOAK_DURATION) IDEMD_SOAK_REPORT=$(CURDIR)/soak-report.txt \
		IDEMD_SOAK_SAMPLES=$(CURDIR)/soak-samples.csv \
		$(GO) test -tags e2e -count=1 -timeout 0 -v -run '^TestSoak$$' ./internal/testing/e2e/

demo: ensure-postgres build
	@scripts/demo.sh

deploy-check: ensure-promtool ensure-kustomize
	@scripts/deploy-check.sh

clean:
	rm -rf $(BIN) bench-report.txt soak-report.txt soak-samples.csv dist build
