#!/usr/bin/env bash
# Builds traefik (./cmd/traefik of github.com/traefik/traefik/v3) at a pinned version from the Go
# module proxy into <output>; `make traefik` runs it when the version is not in the tools cache.
#
#	hack/traefik-build.sh <version> <output> [<module>=<module>@<version> ...]
#
# Each further argument replaces a dependency of the build (go mod edit -replace) with another
# version: for a version the module proxy does not serve (see TRAEFIK_REPLACES in the Makefile).
#
# `go install github.com/traefik/traefik/v3/cmd/traefik@<version>` refuses the module, whose go.mod
# has replace directives: the build runs instead inside a writable copy of the module's directory,
# which `go mod download -json` gives, so that its go.mod (replaces included) is the main module's.
# Two parts of the repository are not in the module, and get placeholders:
#   - the webui's built assets (webui/static, embedded by webui/embed.go): the binary serves no
#     dashboard, which the gateway tests do not use;
#   - since v3.7, pkg/config/dynamic/ext, a module of its own (so left out of the module's zip)
#     that go.mod replaces github.com/traefik/traefik/dynamic/ext with: the dynamic
#     configuration's extension points, HTTP and Router, embedded in dynamic.HTTPConfiguration
#     and dynamic.Router, and empty structs in Traefik's own build.
#
# A cold build (module downloads and compile) took 44 min of wall time and
# 16 min of CPU, niced, on 2 cores shared with a full CI run (load 15 to 25); the binary is 250 MB.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 <version> <output> [<module>=<module>@<version> ...]" >&2; exit 2; }
version=$1 out=$2
shift 2
module=github.com/traefik/traefik/v3
go=${GO:-go}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/traefik-build-XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT

# Outside any module (in $tmp), so that the download touches no go.mod or go.sum of the caller.
dir=$(cd "$tmp" && "$go" mod download -json "$module@$version" | sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')
[ -n "$dir" ] && [ -d "$dir" ] || { echo "go mod download $module@$version gave no directory" >&2; exit 1; }

# The module cache is read-only: copy it, and make the copy writable.
cp -R "$dir" "$tmp/src"
chmod -R u+w "$tmp/src"
# webui/embed.go embeds webui/static, which must hold a file for the build to compile.
if [ -z "$(ls -A "$tmp/src/webui/static" 2>/dev/null)" ]; then
	mkdir -p "$tmp/src/webui/static"
	echo 'The web UI is not built into this traefik.' >"$tmp/src/webui/static/placeholder.txt"
fi
# The extension module, as Traefik's open-source build has it: two empty structs.
ext=$tmp/src/pkg/config/dynamic/ext
if grep -q "=> ./pkg/config/dynamic/ext" "$tmp/src/go.mod" && [ ! -e "$ext/go.mod" ]; then
	mkdir -p "$ext"
	printf 'module github.com/traefik/traefik/dynamic/ext\n\ngo 1.24.0\n' >"$ext/go.mod"
	cat >"$ext/ext.go" <<-'EOF'
	// Package ext holds the extension points of Traefik's dynamic configuration; a placeholder
	// written by limiterd's hack/traefik-build.sh, since the module proxy's zip leaves it out.
	package ext

	// HTTP extends dynamic.HTTPConfiguration.
	type HTTP struct{}

	// Router extends dynamic.Router.
	type Router struct{}
	EOF
fi

mod=()
for r in "$@"; do
	(cd "$tmp/src" && "$go" mod edit -replace "$r")
	# go.sum has no sums for the replacement: let the build add them (checked against the
	# checksum database).
	mod=(-mod=mod)
done

echo "building traefik $version into $out${*:+ (replacing $*)}" >&2
mkdir -p "$(dirname "$out")"
# Into a temporary name first, then renamed: a concurrent checkout never runs half a binary.
(cd "$tmp/src" && CGO_ENABLED=0 "$go" build "${mod[@]}" -trimpath \
	-ldflags "-X $module/pkg/version.Version=$version" \
	-o "$out.tmp.$$" ./cmd/traefik)
mv "$out.tmp.$$" "$out"
