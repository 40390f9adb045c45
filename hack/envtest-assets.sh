#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd) from the Go module proxy, pinned by
# hack/tools/{kube,etcd}/go.mod, and prints the directory to use as KUBEBUILDER_ASSETS.
#
# Binaries are cached by version in the user's cache directory (${XDG_CACHE_HOME:-~/.cache}/limiterd)
# so that a fresh clone on the same machine reuses them; bin/k8s/<version> links to that cache,
# and bin/k8s/current to bin/k8s/<version> (the tests' default KUBEBUILDER_ASSETS). `make envtest`
# runs this script.
# A cold build takes about 7 minutes on 2 cores. kube-apiserver is built by hack/kube-build.sh with the
# release's version stamp; the cache key says so ("-stamped"), so that an older unstamped build
# (which reports v0.0.0-master) is not reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
modversion() { # modversion <go.mod> <module>: the required version of a module
	sed -nE "s#^(require)?[[:space:]]*$2 (v[^ ]+).*#\\2#p" "$1" | head -n 1
}
kube_version=$(modversion "$root/hack/tools/kube/go.mod" k8s.io/kubernetes)
etcd_version=$(modversion "$root/hack/tools/etcd/go.mod" go.etcd.io/etcd/server/v3)
[ -n "$kube_version" ] && [ -n "$etcd_version" ] || { echo "cannot read pinned versions" >&2; exit 1; }
version="kube-${kube_version}-stamped_etcd-${etcd_version}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/limiterd/envtest/${version}"
mkdir -p "$cache"

# One build at a time on the machine: checkouts share the cache.
exec 9>"$cache/../build.lock"
flock 9

build() { # build <dir> <package> <output>
	if [ ! -x "$cache/$3" ]; then
		echo "building $3 ($version) into $cache" >&2
		(cd "$root/hack/tools/$1" && CGO_ENABLED=0 go build -trimpath -o "$cache/$3.tmp" "$2")
		mv "$cache/$3.tmp" "$cache/$3"
	fi
}
"$root/hack/kube-build.sh" "$cache" kube-apiserver
build etcd . etcd

mkdir -p "$root/bin/k8s"
ln -sfn "$cache" "$root/bin/k8s/$version"
ln -sfn "$version" "$root/bin/k8s/current"
echo "$root/bin/k8s/$version"
