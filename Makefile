# limiterd — see README.md. `make help` lists the targets by section.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

GO ?= go
BIN := $(CURDIR)/bin

# Pinned tools. Each is installed once per version into the user's cache directory, so that every
# checkout on the machine reuses it, and linked from bin/ (see the Tools part of the develop
# section).
TOOLS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/limiterd/tools
CONTROLLER_TOOLS_VERSION := v0.23.0
HELM_VERSION := v3.22.0
GOLANGCI_LINT_VERSION := v2.15.0
HELM_DOCS_VERSION := v1.14.2
CADDY_VERSION := v2.11.9
CRD_REF_DOCS_VERSION := v0.3.0
TRAEFIK_VERSION := v3.7.12
CONTROLLER_GEN := $(TOOLS_CACHE)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
HELM := $(TOOLS_CACHE)/helm-$(HELM_VERSION)
GOLANGCI_LINT := $(TOOLS_CACHE)/golangci-lint-$(GOLANGCI_LINT_VERSION)
HELM_DOCS := $(TOOLS_CACHE)/helm-docs-$(HELM_DOCS_VERSION)
CRD_REF_DOCS := $(TOOLS_CACHE)/crd-ref-docs-$(CRD_REF_DOCS_VERSION)
# Caddy for the gateway tests (test/gateways): the plain build, whose standard modules include
# forward_auth.
CADDY := $(TOOLS_CACHE)/caddy-$(CADDY_VERSION)
# Traefik for the gateway tests (test/gateways): ./cmd/traefik built by hack/traefik-build.sh, since
# go install refuses a module with replace directives. The module proxy does not serve the
# go-http-auth fork that every v3.7 release replaces abbot/go-http-auth with (403, "This module
# version is not available"): the build takes the fork's 2020 version, the one v3.6 uses, which
# only the basicAuth and digestAuth middlewares import (the tests use neither). v3.7.13 also needs
# seven DNS provider SDKs the proxy refuses; v3.7.12 builds with this one replacement.
TRAEFIK_REPLACES := github.com/abbot/go-http-auth=github.com/containous/go-http-auth@v0.4.1-0.20200324110947-a37a7636d23e
TRAEFIK := $(TOOLS_CACHE)/traefik-$(TRAEFIK_VERSION)
# The test control plane (kube-apiserver, etcd), pinned by hack/tools/{kube,etcd}/go.mod and built
# by hack/envtest-assets.sh, which links bin/k8s/current to it.
ENVTEST_ASSETS := $(BIN)/k8s/current

# What the tests are told (internal/testbin): where the control plane, helm, helm-docs, caddy,
# traefik and the project's binaries are. No test builds or installs anything.
# Flags of every go test run: the race detector always; test binaries without DWARF (-w), which
# nobody debugs from make and whose generation costs a quarter of make test-unit's CPU. Stack
# traces and race reports keep their file:line (they use the symbol table, not DWARF). -trimpath:
# without it the build cache keys the module's own packages and test binaries on the checkout's
# directory, so that a clone at a new path compiles them all again with -race; no test reads a
# source path (runtime.Caller and the like), and stack traces name files by import path instead.
TEST_FLAGS := -race -ldflags=-w -trimpath
TEST_ENV := KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) HELM=$(HELM) HELM_DOCS=$(HELM_DOCS) CADDY=$(CADDY) TRAEFIK=$(TRAEFIK) LIMITERD_BIN_DIR=$(BIN)
# The packages that run the project's binaries as processes against a control plane or Redis.
E2E_PACKAGES := ./test/e2e/... ./test/redis/...

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} \
		/^##@ / {printf "\n%s\n", substr($$0, 5)} \
		/^[a-zA-Z0-9_-]+:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Develop

.PHONY: build
build: build-limiterd build-kubectl-limiterd ## Build bin/limiterd, bin/manager (the operator), bin/kubectl-limiterd and bin/loadgen.
	$(GO) build -trimpath -o $(BIN)/manager .
	$(GO) build -trimpath -o $(BIN)/loadgen ./cmd/loadgen

.PHONY: build-limiterd
build-limiterd: ## Build bin/limiterd only.
	$(GO) build -trimpath -o $(BIN)/limiterd ./cmd/limiterd

.PHONY: build-kubectl-limiterd
build-kubectl-limiterd: ## Build bin/kubectl-limiterd only, the kubectl plugin (copy it onto your PATH).
	$(GO) build -trimpath -o $(BIN)/kubectl-limiterd ./cmd/kubectl-limiterd

# Where `make run` serves decisions: loopback only, so that a first run exposes nothing to the
# network (the decisions API has no authentication). `make run RUN_ADDR=:8080` serves every
# interface; give --allowed-hosts then (limiterd logs that it answers any Host without it).
RUN_ADDR ?= 127.0.0.1:8080

.PHONY: run
run: build-limiterd ## Run limiterd locally: in-memory store, the sample policy, decisions on 127.0.0.1:8080 (RUN_ADDR), admin on 127.0.0.1:9090.
	$(BIN)/limiterd --policy-file config/samples/ratelimitpolicy.yaml --addr $(RUN_ADDR)

.PHONY: fmt
fmt: golangci-lint ## Format the code with the formatters of .golangci.yml (gofmt, goimports).
	$(GOLANGCI_LINT) fmt ./...

.PHONY: vet
vet: ## Run go vet, with the soak test's build tag so that it is checked too.
	$(GO) vet -tags soak ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint with the repository's .golangci.yml.
	$(GOLANGCI_LINT) run ./...

# Tools. `make tools` installs every pinned tool; each target below installs one and links it from
# bin/ (a no-op once its version is in the cache).

.PHONY: tools
tools: test-tools golangci-lint ## Install every pinned tool: the test control plane, helm, helm-docs, controller-gen, crd-ref-docs, caddy, traefik, golangci-lint.

.PHONY: test-tools
test-tools: envtest helm helm-docs controller-gen crd-ref-docs caddy traefik ## Install the tools `make test` needs: the test control plane, helm, helm-docs, controller-gen, crd-ref-docs, caddy, traefik.

.PHONY: envtest
envtest: ## Build the test control plane (kube-apiserver, etcd) into the cache; bin/k8s/current links to it.
	hack/envtest-assets.sh >/dev/null

.PHONY: helm
helm: $(HELM) ## Install the pinned helm; bin/helm links to it.
	@mkdir -p $(BIN) && ln -sfn $(HELM) $(BIN)/helm

.PHONY: helm-docs
helm-docs: $(HELM_DOCS) ## Install the pinned helm-docs (generates the chart's README); bin/helm-docs links to it.
	@mkdir -p $(BIN) && ln -sfn $(HELM_DOCS) $(BIN)/helm-docs

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Install the pinned controller-gen; bin/controller-gen links to it.
	@mkdir -p $(BIN) && ln -sfn $(CONTROLLER_GEN) $(BIN)/controller-gen

.PHONY: crd-ref-docs
crd-ref-docs: $(CRD_REF_DOCS) ## Install the pinned crd-ref-docs (generates docs/crd-reference.md); bin/crd-ref-docs links to it.
	@mkdir -p $(BIN) && ln -sfn $(CRD_REF_DOCS) $(BIN)/crd-ref-docs

.PHONY: caddy
caddy: $(CADDY) ## Build the pinned caddy (the gateway tests' forward_auth); bin/caddy links to it.
	@mkdir -p $(BIN) && ln -sfn $(CADDY) $(BIN)/caddy

.PHONY: traefik
traefik: $(TRAEFIK) ## Build the pinned traefik (the gateway tests' ForwardAuth); bin/traefik links to it.
	@mkdir -p $(BIN) && ln -sfn $(TRAEFIK) $(BIN)/traefik

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Install the pinned golangci-lint; bin/golangci-lint links to it.
	@mkdir -p $(BIN) && ln -sfn $(GOLANGCI_LINT) $(BIN)/golangci-lint

# go-install <output> <package@version>: go install into a private directory, then move the binary
# to its versioned name in the cache (atomic, so concurrent checkouts never see half a binary).
define go-install
	mkdir -p $(TOOLS_CACHE)
	gobin=$$(mktemp -d $(TOOLS_CACHE)/gobin-XXXXXX) && \
	GOBIN=$$gobin $(GO) install $(2) && \
	mv $$gobin/$$(basename $$(echo $(2) | cut -d@ -f1)) $(1) && rmdir $$gobin
endef

$(CONTROLLER_GEN):
	$(call go-install,$@,sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION))

$(HELM):
	$(call go-install,$@,helm.sh/helm/v3/cmd/helm@$(HELM_VERSION))

$(GOLANGCI_LINT):
	$(call go-install,$@,github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION))

$(HELM_DOCS):
	$(call go-install,$@,github.com/norwoodj/helm-docs/cmd/helm-docs@$(HELM_DOCS_VERSION))

$(CRD_REF_DOCS):
	$(call go-install,$@,github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION))

$(CADDY):
	$(call go-install,$@,github.com/caddyserver/caddy/v2/cmd/caddy@$(CADDY_VERSION))

$(TRAEFIK):
	GO=$(GO) hack/traefik-build.sh $(TRAEFIK_VERSION) $@ $(TRAEFIK_REPLACES)

##@ Test

.PHONY: test
test: test-tools verify-generated build node-deps ## CI: install the tools, check generated files, build the binaries and images, run every test with -race, then the chart on a real node (test-cluster).
	$(GO) vet -tags soak ./test/soak/ # make soak is not part of make test: check it still builds
	$(TEST_ENV) $(GO) test $(TEST_FLAGS) -count=1 -timeout 30m $(TEST_LONGEST_FIRST) ./...
	$(ENVOY_GATEWAY_TEST)
	$(BENCH_TEST)
	$(MEMORY_TEST)
	$(CLUSTER_TEST)

# The packages whose tests take longest, named before ./... so that go test builds and starts them
# first (it schedules in the order packages are named, and runs two at once on 2 cores): started
# in alphabetical order, store/redis (about 100 s of tests, most of them CPU) began two minutes
# into the run and was its tail.
TEST_LONGEST_FIRST := ./limiterd/store/redis ./test/helm ./test/e2e ./cmd/limiterd ./limiterd/limiter

# Every benchmark once (-benchtime 1x), so that a broken one fails make test: the packages of this
# module with a Benchmark function (clientbench is a module of its own), with the -race test run's
# flags so that its test binaries are reused. BENCH_TEST_SKIPPED are the benchmarks whose setup alone
# takes minutes under -race (a million clients, 10,000 policies); make bench runs them. On a loaded
# 2-core machine this adds about 50 s to make test, half of it linking. Keep it a run of its own:
# go test runs the test binaries of a run with -bench one at a time, so -bench in the -race run
# serialized every package (a fresh clone's CI took 13:46 against 9:34 without it).
BENCH_TEST_SKIPPED := ManyClients|Load10000Policies
BENCH_TEST = $(TEST_ENV) $(GO) test $(TEST_FLAGS) -count=1 -run '^$$' -bench . -benchtime 1x -skip '$(BENCH_TEST_SKIPPED)' \
	$$(grep -rl --include='*_test.go' '^func Benchmark' . | xargs -n1 dirname | sort -u | grep -v /clientbench)

.PHONY: test-bench
test-bench: ## Every benchmark once (-benchtime 1x) as make test runs them, but the slowest: a smoke test, not a measurement.
	$(BENCH_TEST)

# The tests that hold a bound against the process's real memory (limiterd/limiter/rss_test.go,
# whose tests all have RSS in their name). The race detector's shadow memory would count in RSS,
# so the file is built only without -race (//go:build !race), which every other run uses: they
# run here, in a go test of their own, after the -race run so that no other package's test binary
# competes for the machine's memory.
MEMORY_TEST = $(GO) test -ldflags=-w -count=1 -run RSS ./limiterd/limiter

.PHONY: test-memory
test-memory: ## The memory tests make test runs without -race: the byte budget holds RSS under a 160 MiB limit in a flood of long keys.
	$(MEMORY_TEST)

# Every test of these packages needs a control plane, Redis, bin/ or a node: under -short they all
# skip, so test-unit does not build and link them (three race binaries of the Kubernetes client).
UNIT_SKIPPED_PACKAGES := /test/e2e /test/redis /test/cluster
# Packages test-unit builds and runs at once. Unit tests mostly wait (timeouts, sockets, signals)
# rather than compute, so twice the 2 cores keeps both busy: on an idle 2-core machine the loop
# took 77 s at go test's default (-p = cores) and 43 s at 4.
UNIT_TEST_PACKAGES_AT_ONCE ?= 4

.PHONY: test-unit
test-unit: ## The fast loop: every test that needs only Go (-short skips those needing a control plane, Redis, helm or bin/).
	$(GO) test -short -p $(UNIT_TEST_PACKAGES_AT_ONCE) $(TEST_FLAGS) $$($(GO) list ./... | grep -v $(foreach p,$(UNIT_SKIPPED_PACKAGES),-e $(p)))

.PHONY: test-integration
test-integration: test-tools build ## Every package but the end-to-end ones, with the control plane, Redis and helm.
	$(TEST_ENV) $(GO) test $(TEST_FLAGS) -count=1 -timeout 30m $$($(GO) list ./... | grep -v -e /test/e2e -e /test/redis)

.PHONY: test-e2e
test-e2e: envtest build ## The end-to-end packages: bin/manager and bin/limiterd as processes against a control plane and Redis.
	$(TEST_ENV) $(GO) test $(TEST_FLAGS) -count=1 -timeout 30m $(E2E_PACKAGES)

# The check of docs/gateways/envoy-gateway.yaml with Envoy Gateway's own API types: a module of its
# own (test/gateways/envoygateway), since github.com/envoyproxy/gateway brings its whole dependency
# graph, so go test ./... does not reach it.
ENVOY_GATEWAY_TEST = cd test/gateways/envoygateway && $(GO) test $(TEST_FLAGS) -count=1 ./...

.PHONY: test-gateways
test-gateways: caddy traefik ## The gateway tests: nginx (apt nginx-light), Caddy and Traefik (pinned, built into the tools cache) in front of limiterd's forward-auth, with the configurations of docs/gateways; the Envoy, Istio and Envoy Gateway configurations decoded with their own types.
	$(TEST_ENV) $(GO) test $(TEST_FLAGS) -count=1 ./test/gateways/...
	$(GO) test $(TEST_FLAGS) -count=1 -run '^TestShipped' ./limiterd/extauthz/
	$(ENVOY_GATEWAY_TEST)

.PHONY: helm-test
helm-test: envtest helm helm-docs ## The chart's tests: lint, template, schema, docs, install into a test API server.
	$(TEST_ENV) $(GO) test $(TEST_FLAGS) -count=1 ./test/helm/...

SOAK_DURATION ?= 5m
SOAK_TIMEOUT ?= 2h

.PHONY: soak
soak: build-limiterd ## Soak test, not part of make test: floods, policy churn, Redis kill/pause, SIGTERM under load against bin/limiterd for SOAK_DURATION (default 5m).
	LIMITERD_BIN=$(BIN)/limiterd SOAK_DURATION=$(SOAK_DURATION) $(GO) test -tags soak -count=1 -v -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' ./test/soak/

##@ Generate

# Files written by controller-gen from the markers in api/ and controllers/; `make verify` checks
# they are current.
GENERATED_PATHS := api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac/role.yaml docs/crd-reference.md

.PHONY: generate
generate: controller-gen ## Generate the API's deep-copy functions (api/v1alpha1/zz_generated.deepcopy.go).
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: manifests-crd manifests-rbac crd-docs ## Generate the CRD, its reference (docs/crd-reference.md) and the operator's RBAC from the markers.

.PHONY: crd-docs
crd-docs: crd-ref-docs ## Generate the CRD's reference, docs/crd-reference.md, from the API types (crd-ref-docs, hack/crd-ref-docs/config.yaml).
	$(CRD_REF_DOCS) --source-path=./api/v1alpha1 --config=hack/crd-ref-docs/config.yaml --renderer=markdown --output-path=docs/crd-reference.md --log-level=WARN

.PHONY: manifests-crd
manifests-crd: controller-gen ## Generate the RateLimitPolicy CRD into config/crd/bases from the API's markers.
	rm -f config/crd/bases/*.yaml
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases

.PHONY: manifests-rbac
manifests-rbac: controller-gen ## Generate the operator's RBAC (config/rbac/role.yaml) from the markers in controllers/.
	$(CONTROLLER_GEN) rbac:roleName=limiterd-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac

# The chart's README.md is helm-docs' rendering of README.md.gotmpl with the "# --" comments of
# values.yaml, in file order. test/helm (TestReadmeCurrent) runs helm-docs with the same flags and
# --dry-run, and fails when the committed README.md differs; it also checks the two copies.
HELM_DOCS_FLAGS = --chart-search-root $(CHART) --sort-values-order file --log-level warning

.PHONY: chart-docs
chart-docs: helm-docs ## Regenerate the chart's README.md (helm-docs) and its copies of the CRD (config/crd/bases) and the Grafana dashboard (docs/grafana).
	rm -f $(CHART)/files/crds/*.yaml
	cp config/crd/bases/*.yaml $(CHART)/files/crds/
	cp docs/grafana/limiterd.json $(CHART)/files/dashboards/limiterd.json
	$(HELM_DOCS) $(HELM_DOCS_FLAGS)

.PHONY: verify
verify: verify-generated lint ## Everything a reviewer checks: generated files are current, and golangci-lint passes.

.PHONY: verify-generated
verify-generated: generate manifests ## Regenerate, then fail if generated files differ from the committed ones (or are untracked).
	git diff --exit-code -- $(GENERATED_PATHS)
	@changed=$$(git status --porcelain --untracked-files=all -- $(GENERATED_PATHS)); \
	if [ -n "$$changed" ]; then \
		printf 'generated files are not committed or out of date (run make generate manifests):\n%s\n' "$$changed" >&2; \
		exit 1; \
	fi

##@ Benchmark

BENCH_WORKERS ?= 16
BENCH_TIME ?= 5s

.PHONY: bench
bench: ## Run the core benchmarks side by side with their baselines (x/time/rate, a trivial handler); figures go to stdout.
	$(GO) test -run '^$$' -bench 'HotKey|ManyClients' -benchmem ./limiterd/limiter
	$(GO) test -run '^$$' -bench 'Parallel' -benchmem -cpu 1,2 ./limiterd/limiter
	$(GO) test -run '^$$' -bench . -benchmem ./limiterd/engine ./limiterd/policy ./limiterd/server

.PHONY: bench-http
bench-http: ## Load-test the decision handler against a trivial handler, single calls against batches of 100, and forward-auth against /v1/allow, over loopback HTTP.
	$(GO) run ./cmd/loadgen --duration 2s --rounds 8 --workers 16

.PHONY: bench-grpc
bench-grpc: ## Decisions/s and p50/p99 latency of the gRPC (Envoy) API and the HTTP API, each beside its baseline (an empty rate-limit server, a trivial handler), same load, 3 rounds.
	$(GO) test -run '^$$' -bench 'GRPCvsHTTP' -benchtime $(BENCH_TIME) -count 1 ./limiterd/envoyrls -args -bench-workers=$(BENCH_WORKERS)

.PHONY: bench-redis
bench-redis: ## Decisions/s and p50/p99 on a local redis-server: Store.Decide, the HTTP path single and in batches of 100, redis-benchmark running the same script; then per algorithm and stack of two, Redis CPU µs and commands per decision. One run.
	$(GO) test -run '^$$' -bench '^BenchmarkRedis(Cost)?$$' -benchtime 50000x -count 1 ./limiterd/store/redis/

.PHONY: bench-redis-clients
bench-redis-clients: ## Compare Redis clients (rueidis, go-redis pool, go-redis autopipeline) running the token-bucket script (a module of its own).
	cd limiterd/store/redis/clientbench && $(GO) test -run '^$$' -bench . -benchtime 50000x -count 1

##@ Release

CHART := charts/limiterd
# The release version: the chart's appVersion, which is also the images' default tag in the chart.
VERSION ?= $(shell sed -nE 's/^appVersion:[[:space:]]*"?([^"[:space:]]+)"?.*/\1/p' $(CHART)/Chart.yaml)
IMAGE_REGISTRY ?= ghcr.io/limiterd
IMG_LIMITERD ?= $(IMAGE_REGISTRY)/limiterd:$(VERSION)
IMG_MANAGER ?= $(IMAGE_REGISTRY)/manager:$(VERSION)
CONTAINER_TOOL ?= docker

.PHONY: helm-lint
helm-lint: helm ## helm lint --strict the chart with its defaults and with each ci/*-values.yaml.
	$(HELM) lint --strict $(CHART)
	for f in $(CHART)/ci/*-values.yaml; do $(HELM) lint --strict $(CHART) --values "$$f"; done

# Static binaries built like the Dockerfiles' builder stage (CGO_ENABLED=0, -trimpath, -s -w; no VCS
# stamp, which the Dockerfile build cannot see either), then put into the image the Dockerfile's
# final stage describes by hack/ociimage: one layer, files sorted and stamped SOURCE_DATE_EPOCH
# (the last commit's time), so the same commit gives the same image digest.
IMAGES_DIR := $(BIN)/images
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_GOFLAGS := -trimpath -buildvcs=false -ldflags='-s -w'
OCIIMAGE = $(GO) run ./hack/ociimage -epoch $(SOURCE_DATE_EPOCH)

.PHONY: images
images: ## Build the limiterd and operator images without a daemon: bin/images/{limiterd,manager}.tar for ctr images import / docker load.
	mkdir -p $(BIN)/image $(IMAGES_DIR)
	CGO_ENABLED=0 $(GO) build $(IMAGE_GOFLAGS) -o $(BIN)/image/limiterd ./cmd/limiterd
	CGO_ENABLED=0 $(GO) build $(IMAGE_GOFLAGS) -o $(BIN)/image/manager .
	$(OCIIMAGE) -dockerfile Dockerfile.limiterd -ref $(IMG_LIMITERD) -stage-file /out/limiterd=$(BIN)/image/limiterd \
		-build-arg VERSION=$(VERSION) -build-arg REVISION=$(REVISION) -o $(IMAGES_DIR)/limiterd.tar
	$(OCIIMAGE) -dockerfile Dockerfile.manager -ref $(IMG_MANAGER) -stage-file /out/manager=$(BIN)/image/manager \
		-build-arg VERSION=$(VERSION) -build-arg REVISION=$(REVISION) -o $(IMAGES_DIR)/manager.tar

.PHONY: docker-images
docker-images: ## Print the image names docker-build tags (VERSION defaults to the chart's appVersion).
	@echo $(IMG_LIMITERD)
	@echo $(IMG_MANAGER)

.PHONY: docker-build
docker-build: ## Build the limiterd and operator images (CONTAINER_TOOL, IMAGE_REGISTRY, VERSION).
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) -f Dockerfile.limiterd -t $(IMG_LIMITERD) .
	$(CONTAINER_TOOL) build --build-arg VERSION=$(VERSION) -f Dockerfile.manager -t $(IMG_MANAGER) .

.PHONY: docker-push
docker-push: ## Push the images docker-build tagged.
	$(CONTAINER_TOOL) push $(IMG_LIMITERD)
	$(CONTAINER_TOOL) push $(IMG_MANAGER)

##@ Test node (a real single-node cluster on this machine; hack/node/node.sh)

KUBE_VERSION := $(shell sed -nE 's/^require k8s.io\/kubernetes (v[^ ]+)$$/\1/p' hack/tools/kube/go.mod)
# kubelet, kube-controller-manager, kube-scheduler, kube-proxy: built from the module proxy with the
# release's version stamp, cached by version (a cold build takes minutes; see hack/kube-build.sh).
NODE_BIN ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/limiterd/node/kube-$(KUBE_VERSION)-stamped
NODE_COMPONENTS := kubelet kube-controller-manager kube-scheduler kube-proxy

.PHONY: node-binaries
node-binaries: ## Build the node's Kubernetes components (kubelet, kube-controller-manager, kube-scheduler, kube-proxy) into the cache if missing.
	hack/kube-build.sh $(NODE_BIN) $(NODE_COMPONENTS)

.PHONY: node-images
node-images: ## Build the test node's pause image (bin/images/pause.tar) without a daemon.
	mkdir -p $(BIN)/image $(IMAGES_DIR)
	CGO_ENABLED=0 $(GO) build $(IMAGE_GOFLAGS) -o $(BIN)/image/pause ./hack/node/pause
	$(OCIIMAGE) -dockerfile hack/node/pause/Dockerfile -ref limiterd.local/pause:1 -stage-file /out/pause=$(BIN)/image/pause -o $(IMAGES_DIR)/pause.tar

.PHONY: node-deps
node-deps: node-binaries node-images images envtest $(HELM) ## Build everything the test node and test-cluster need.

# The environment of hack/node/node.sh and test/cluster.
NODE_ENV = NODE_BIN=$(NODE_BIN) ENVTEST_BIN=$$(hack/envtest-assets.sh) PAUSE_IMAGE_ARCHIVE=$(IMAGES_DIR)/pause.tar \
	NODE_IMAGES="$(IMAGES_DIR)/limiterd.tar $(IMAGES_DIR)/manager.tar" HELM=$(HELM) \
	IMG_LIMITERD=$(IMG_LIMITERD) IMG_MANAGER=$(IMG_MANAGER)
# test/cluster on the test node; make test runs it after every other package, alone, since it
# starts a node and measures failed requests under load.
CLUSTER_TEST = $(NODE_ENV) LIMITERD_TEST_CLUSTER=1 $(GO) test $(TEST_FLAGS) -count=1 -v -timeout 20m ./test/cluster/...

.PHONY: node-up
node-up: node-deps ## Start the test node (root; containerd, runc, CNI plugins, iptables from apt); prints its kubeconfig.
	$(NODE_ENV) hack/node/node.sh up

.PHONY: node-down
node-down: ## Stop the test node and undo everything it changed on this machine.
	NODE_BIN=$(NODE_BIN) hack/node/node.sh down

.PHONY: test-cluster
test-cluster: node-deps ## End-to-end on the test node: helm install the chart with the built images, traffic, rollout, Redis, uninstall, metrics.
	$(CLUSTER_TEST)
