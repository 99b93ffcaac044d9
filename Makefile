# ckptkit developer targets. `make test` is what CI runs (.ci/run).
GO ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: build python wheel test test-short lint bench reliability proto servers-start servers-stop clean

# The commit is stamped for `ckpt --version` also where Go's own VCS
# stamping is off (GOFLAGS=-buildvcs=false).
build:
	$(GO) build -ldflags "-X main.commit=$$(git rev-parse HEAD 2>/dev/null)" -o bin/ckpt ./cmd/ckpt

# libckptkit (the C ABI in capi/) built into the Python package, so that
# PYTHONPATH=python (or pip install ./python) makes `import ckptkit` work.
python:
	CGO_ENABLED=1 $(GO) build -buildmode=c-shared -trimpath -ldflags "-s -w" -o python/ckptkit/libckptkit.so ./capi

# The platform wheel, libckptkit inside (scripts/wheel.sh; built by setuptools
# in the trixie torch environment): dist/ckptkit-<version>-py3-none-<platform>.whl.
wheel:
	bash scripts/wheel.sh

# The whole suite: lint (fails on findings), then starts the S3/GCS test
# servers, runs every test (including the conformance matrix on every backend
# and plugin), stops the servers, then the Python suite in the torch
# environment (docs/TORCH.md).
test:
	bash scripts/test.sh

test-short:
	bash scripts/test.sh -short

# gofmt, go vet and staticcheck (pinned, cached under ~/.cache/ckptkit/bin);
# fails on any finding. `make test` runs it first.
lint:
	STATICCHECK_VERSION=$(STATICCHECK_VERSION) bash scripts/lint.sh

bench:
	bash scripts/bench.sh

# The issue 16 reliability campaign at full size (docs/RELIABILITY.md):
# SIGKILL points, concurrent writers, bit flips, faulted connections, the
# hostile corpus, killed uploads, then every fuzz target for FUZZTIME
# (default 10m). `make test` runs a bounded subset of the same tests.
reliability:
	bash scripts/reliability.sh

proto:
	bash plugins/proto/gen.sh

servers-start:
	bash scripts/test-servers.sh start

servers-stop:
	bash scripts/test-servers.sh stop

clean:
	rm -rf bin dist build python/ckptkit/libckptkit.so python/ckptkit/libckptkit.h
