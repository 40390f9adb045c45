package main

import (
	"runtime/debug"
	"strings"
)

// buildVersion describes the running binary from its build information: the module version
// ("(devel)" when built from a checkout), the VCS revision and time with "+dirty" for
// uncommitted changes when Go recorded them (go build in a Git checkout, without
// -buildvcs=false), and the Go version that built it. For example
// "(devel) revision 69fa98b…+dirty 2026-12-07T06:00:00Z go1.26.8".
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information)"
	}
	return formatVersion(info)
}

// formatVersion formats info for buildVersion.
func formatVersion(info *debug.BuildInfo) string {
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	var b strings.Builder
	b.WriteString(version)
	var revision, modified, when string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		case "vcs.time":
			when = s.Value
		}
	}
	if revision != "" {
		b.WriteString(" revision " + revision + modified)
		if when != "" {
			b.WriteString(" " + when)
		}
	}
	if info.GoVersion != "" {
		b.WriteString(" " + info.GoVersion)
	}
	return b.String()
}
