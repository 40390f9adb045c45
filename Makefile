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
build: ## Build bin/limiterd (and the other binaries) from this checkout.
	$(GO) build -trimpath -o $(BIN)/limiterd ./cmd/limiterd

.PHONY: run
run: build ## Run limiterd locally: in-memory store, the sample policy, decisions on :8080, admin on :9090.
	$(BIN)/limiterd --policy-file config/samples/ratelimitpolicy.yaml

##@ Test

.PHONY: test
test: ## Run every test (unit, fuzz seeds, integration, end-to-end) with -race.
	$(GO) test -race -count=1 ./...

.PHONY: bench
bench: ## Run the benchmarks side by side with their baselines; figures go to stdout.
	$(GO) test -run '^$$' -bench . -benchmem ./limiterd/...

##@ Tools

$(CONTROLLER_GEN):
	mkdir -p $(TOOLS_CACHE)
	GOBIN=$(TOOLS_CACHE)/gobin-controller-gen $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(TOOLS_CACHE)/gobin-controller-gen/controller-gen $@

$(HELM):
	mkdir -p $(TOOLS_CACHE)
	GOBIN=$(TOOLS_CACHE)/gobin-helm $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(TOOLS_CACHE)/gobin-helm/helm $@

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

.PHONY: verify
verify: generate manifests ## Regenerate, then fail if generated files differ from the committed ones (or are untracked).
	git diff --exit-code -- $(GENERATED_PATHS)
	@changed=$$(git status --porcelain --untracked-files=all -- $(GENERATED_PATHS)); \
	if [ -n "$$changed" ]; then \
		printf 'generated files are not committed or out of date (run make generate manifests):\n%s\n' "$$changed" >&2; \
		exit 1; \
	fi
