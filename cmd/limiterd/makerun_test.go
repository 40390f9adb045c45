package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMakeRunLoopbackOnly: `make run`, the README's first command, serves every API on loopback
// only, so that a first run exposes nothing to the network, and answers only the Hosts of the
// machine (IP addresses, localhost). Before, it served the unauthenticated decisions API on
// every interface (--addr :8080) and answered any Host.
func TestMakeRunLoopbackOnly(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make on PATH")
	}
	// -n prints the recipe without running it; -o build-limiterd leaves out the build.
	cmd := exec.CommandContext(t.Context(), makeBin, "-n", "--no-print-directory", "-o", "build-limiterd", "run")
	cmd.Dir = "../.."
	// The Makefile's defaults, not the caller's: no RUN_ADDR, and no flags of an outer make.
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "RUN_ADDR", "MAKEFLAGS", "MFLAGS", "MAKELEVEL":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.String())
	}
	var args []string
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) > 0 && strings.HasSuffix(fields[0], "/limiterd") {
			args = fields[1:]
		}
	}
	if args == nil {
		t.Fatalf("make -n run runs no limiterd:\n%s", out)
	}
	cfg, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatalf("flags of make run %q: %v", args, err)
	}
	if !isLoopback(cfg.addr) {
		t.Errorf("make run serves decisions on %q, want a loopback address (flags %q)", cfg.addr, args)
	}
	if decisionsHostCheck(cfg.addr, cfg.allowedHosts) == nil {
		t.Errorf("make run answers decisions to any Host (flags %q)", args)
	}
	if !isLoopback(cfg.adminAddr) {
		t.Errorf("make run serves the admin API on %q, want a loopback address (flags %q)", cfg.adminAddr, args)
	}
	if cfg.grpcAddr != "" && !isLoopback(cfg.grpcAddr) {
		t.Errorf("make run serves gRPC on %q, want none or a loopback address (flags %q)", cfg.grpcAddr, args)
	}
}
