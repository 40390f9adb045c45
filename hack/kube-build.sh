#!/usr/bin/env bash
# kube-build.sh <dir> <component>...: builds Kubernetes components (kube-apiserver, kubelet, ...) from
# the Go module proxy, pinned by hack/tools/kube/go.mod, into <dir> unless they are already there.
#
# The binaries carry the version stamp a release build has (k8s.io/component-base/version and
# k8s.io/client-go/pkg/version: gitVersion, gitMajor, gitMinor, buildDate), so that /version reports
# the pinned release and helm's kubeVersion checks pass; a plain `go build` reports v0.0.0-master.
# buildDate is the pinned module's publication time, so two builds of one version are identical.
# Components build one at a time, at low priority: the machine is shared, and most packages come from
# the Go build cache after the first one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
shift
mod="$root/hack/tools/kube"
read -r version modtime < <(cd "$mod" && go list -m -f '{{.Version}} {{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
[[ "$version" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || { echo "kube-build: unexpected k8s.io/kubernetes version '$version'" >&2; exit 1; }
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=${BASH_REMATCH[1]} -X $pkg.gitMinor=${BASH_REMATCH[2]}"
	ldflags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$modtime"
done
mkdir -p "$dir"
for component in "$@"; do
	[ -x "$dir/$component" ] && continue
	echo "kube-build: building $component $version into $dir" >&2
	start=$SECONDS
	(cd "$mod" && CGO_ENABLED=0 nice go build -trimpath -ldflags "$ldflags" -o "$dir/$component.tmp" "k8s.io/kubernetes/cmd/$component")
	mv "$dir/$component.tmp" "$dir/$component"
	echo "kube-build: $component built in $((SECONDS - start))s" >&2
done
