# ckptkit developer targets. `make test` is what CI runs (.ci/run).
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin

.PHONY: build python test test-short lint bench proto servers-start servers-stop clean

build:
	$(GO) build -o bin/ckpt ./cmd/ckpt

# The whole suite: starts the S3/GCS test servers, runs every test (including
# the conformance matrix on every backend and plugin), stops the servers.
# libckptkit (the C ABI in capi/) built into the Python package, so that
# PYTHONPATH=python (or pip install ./python) makes `import ckptkit` work.
python:
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -ldflags "-s -w" -o python/ckptkit/libckptkit.so ./capi

test:
	bash scripts/test.sh

test-short:
	bash scripts/test.sh -short

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1)
	$(GO) vet ./...
	@test -x $(GOBIN_DIR)/staticcheck || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(GOBIN_DIR)/staticcheck ./...

bench:
	bash scripts/bench.sh

proto:
	bash plugins/proto/gen.sh

servers-start:
	bash scripts/test-servers.sh start

servers-stop:
	bash scripts/test-servers.sh stop

clean:
	rm -rf bin python/ckptkit/libckptkit.so python/ckptkit/libckptkit.h
