#!/usr/bin/env bash
# Regenerates the derived files of charts/limiterd from the repository: the CRD copy
# (files/crds, from config/crd/bases), the dashboard copy (files/dashboards, from docs/grafana)
# and README.md (from README.md.gotmpl and the "# --" comments of values.yaml).
#   hack/helm-docs.sh          write them
#   hack/helm-docs.sh -check   exit 1, naming them, when any is out of date
# The chart's tests (test/helm) run the same check.
set -euo pipefail
cd "$(dirname "$0")/.."
exec go run ./test/helm/chartgen/cmd/chartgen "$@"
