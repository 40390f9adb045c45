# limiterd — see README.md. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c

GO ?= go
BIN := $(CURDIR)/bin
# Pinned tools, installed into the user's cache directory by version and linked from bin/.
TOOLS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/limiterd/tools
CONTROLLER_TOOLS_VERSION := v0.23.0
CONTROLLER_GEN := $(TOOLS_CACHE)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
HELM_VERSION := v3.22.0
HELM := $(TOOLS_CACHE)/helm-$(HELM_VERSION)

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

##@ Build and run

.PHONY: build
build: build-limiterd ## Build bin/limiterd, bin/manager (the operator) and bin/loadgen.
	$(GO) build -trimpath -o $(BIN)/loadgen ./cmd/loadgen
	$(GO) build -trimpath -o $(BIN)/manager .

.PHONY: run
.PHONY: build-limiterd
build-limiterd: ## Build bin/limiterd only.
	$(GO) build -trimpath -o $(BIN)/limiterd ./cmd/limiterd

run: build-limiterd ## Run limiterd locally: in-memory store, the sample policy, decisions on :8080, admin on :9090.
	$(BIN)/limiterd --policy-file config/samples/ratelimitpolicy.yaml

##@ Test

.PHONY: test
test: verify-generated ## Check generated files, then run every test (unit, fuzz seeds, integration, end-to-end) with -race.
	$(GO) test -race -count=1 -timeout 30m ./...

.PHONY: bench
bench: ## Run the core benchmarks side by side with their baselines (x/time/rate, a trivial handler); figures go to stdout.
	$(GO) test -run '^$$' -bench 'HotKey|ManyClients' -benchmem ./limiterd/limiter
	$(GO) test -run '^$$' -bench 'Parallel' -benchmem -cpu 1,2 ./limiterd/limiter
	$(GO) test -run '^$$' -bench . -benchmem ./limiterd/engine ./limiterd/policy ./limiterd/server

SOAK_DURATION ?= 5m
SOAK_TIMEOUT ?= 2h

.PHONY: soak
soak: build-limiterd ## Soak test, not part of make test: floods, policy churn, Redis kill/pause, SIGTERM under load against bin/limiterd for SOAK_DURATION (default 5m).
	LIMITERD_BIN=$(BIN)/limiterd SOAK_DURATION=$(SOAK_DURATION) $(GO) test -tags soak -count=1 -v -timeout $(SOAK_TIMEOUT) -run '^TestSoak$$' ./test/soak/

.PHONY: bench-http
bench-http: ## Load-test the decision handler against a trivial handler over loopback HTTP.
	$(GO) run ./cmd/loadgen --duration 2s --rounds 8 --workers 16

##@ Tools

$(CONTROLLER_GEN):
	mkdir -p $(TOOLS_CACHE)
	GOBIN=$(TOOLS_CACHE)/gobin-controller-gen $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(TOOLS_CACHE)/gobin-controller-gen/controller-gen $@

$(HELM):
	mkdir -p $(TOOLS_CACHE)
	GOBIN=$(TOOLS_CACHE)/gobin-helm $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(TOOLS_CACHE)/gobin-helm/helm $@

GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(TOOLS_CACHE)/golangci-lint-$(GOLANGCI_LINT_VERSION)

$(GOLANGCI_LINT):
	mkdir -p $(TOOLS_CACHE)
	GOBIN=$(TOOLS_CACHE)/gobin-golangci-lint $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(TOOLS_CACHE)/gobin-golangci-lint/golangci-lint $@

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint with the repository's .golangci.yml.
	$(GOLANGCI_LINT) run ./...

.PHONY: tools
tools: $(CONTROLLER_GEN) $(HELM) ## Install the pinned tools (controller-gen, helm) into the cache.

##@ Generate

# Files written by controller-gen from the markers in api/; `make verify` checks they are current.
GENERATED_PATHS := api/v1alpha1/zz_generated.deepcopy.go config/crd/bases

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the API's deep-copy functions (api/v1alpha1/zz_generated.deepcopy.go).
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the RateLimitPolicy CRD into config/crd/bases from the API's markers.
	rm -f config/crd/bases/*.yaml
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases

.PHONY: verify verify-generated
verify: verify-generated lint ## Everything a reviewer checks: generated files are current, and golangci-lint passes.

verify-generated: generate manifests ## Regenerate, then fail if generated files differ from the committed ones (or are untracked).
	git diff --exit-code -- $(GENERATED_PATHS)
	@changed=$$(git status --porcelain --untracked-files=all -- $(GENERATED_PATHS)); \
	if [ -n "$$changed" ]; then \
		printf 'generated files are not committed or out of date (run make generate manifests):\n%s\n' "$$changed" >&2; \
		exit 1; \
	fi

##@ Operator

# The operator's RBAC comes from the +kubebuilder:rbac markers in controllers/.
GENERATED_PATHS += config/rbac/role.yaml

.PHONY: manifests-rbac
manifests-rbac: $(CONTROLLER_GEN) ## Generate the operator's RBAC (config/rbac/role.yaml) from the markers in controllers/.
	$(CONTROLLER_GEN) rbac:roleName=limiterd-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac

manifests: manifests-rbac

.PHONY: envtest
envtest: ## Build the test control plane (kube-apiserver, etcd) into the cache if missing; prints KUBEBUILDER_ASSETS.
	hack/envtest-assets.sh

##@ Helm chart and images

CHART := charts/limiterd
# The release version: the chart's appVersion, which is also the images' default tag in the chart.
VERSION ?= $(shell sed -nE 's/^appVersion:[[:space:]]*"?([^"[:space:]]+)"?.*/\1/p' $(CHART)/Chart.yaml)
IMAGE_REGISTRY ?= ghcr.io/limiterd
IMG_LIMITERD ?= $(IMAGE_REGISTRY)/limiterd:$(VERSION)
IMG_MANAGER ?= $(IMAGE_REGISTRY)/manager:$(VERSION)
CONTAINER_TOOL ?= docker

.PHONY: helm-path
helm-path: $(HELM) ## Install the pinned helm into the cache if missing; print its path.
	@echo $(HELM)

.PHONY: helm-lint
helm-lint: $(HELM) ## helm lint --strict the chart with its defaults and with each ci/*-values.yaml.
	$(HELM) lint --strict $(CHART)
	for f in $(CHART)/ci/*-values.yaml; do $(HELM) lint --strict $(CHART) --values "$$f"; done

.PHONY: helm-docs
helm-docs: ## Regenerate the chart's README.md and its copies of the CRD and the Grafana dashboard.
	hack/helm-docs.sh

.PHONY: helm-test
helm-test: $(HELM) ## Run the chart's tests: lint, template, schema, docs, install into a test API server.
	HELM=$(HELM) $(GO) test -race -count=1 ./test/helm/...

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

##@ Images without a daemon

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

.PHONY: node-up
node-up: node-deps ## Start the test node (root; containerd, runc, CNI plugins, iptables from apt); prints its kubeconfig.
	$(NODE_ENV) hack/node/node.sh up

.PHONY: node-down
node-down: ## Stop the test node and undo everything it changed on this machine.
	NODE_BIN=$(NODE_BIN) hack/node/node.sh down

.PHONY: test-cluster
test-cluster: node-deps ## End-to-end on the test node: helm install the chart with the built images, traffic, rollout, Redis, uninstall, metrics.
	$(NODE_ENV) LIMITERD_TEST_CLUSTER=1 $(GO) test -count=1 -v -timeout 20m ./test/cluster/...

##@ Envoy rate-limit service

BENCH_WORKERS ?= 16
BENCH_TIME ?= 5s

.PHONY: bench-grpc
bench-grpc: ## Decisions/s and p50/p99 latency of the gRPC (Envoy) API against the HTTP API, same load, one run.
	$(GO) test -run '^$$' -bench 'GRPCvsHTTP' -benchtime $(BENCH_TIME) -count 1 ./limiterd/envoyrls -args -bench-workers=$(BENCH_WORKERS)

##@ Redis store

.PHONY: bench-redis
bench-redis: ## Decisions/s and p50/p99 on a local redis-server: Store.Decide, the HTTP path, and redis-benchmark running the same script, one run.
	$(GO) test -run '^$$' -bench 'BenchmarkRedis$$' -benchtime 50000x -count 1 ./limiterd/store/redis/

.PHONY: bench-redis-clients
bench-redis-clients: ## Compare Redis clients (rueidis, go-redis pool, go-redis autopipeline) running the token-bucket script (a module of its own).
	cd limiterd/store/redis/clientbench && $(GO) test -run '^$$' -bench . -benchtime 50000x -count 1
