package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestRun runs a short, small load against both in-process servers on loopback.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--workers", "2", "--duration", "200ms", "--warmup", "0s", "--rounds", "2", "--keys", "50", "--max-requests", "2000", "--batch", "10"}
	if err := run(args, &out, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"GOMAXPROCS=", "trivial", "limiterd", "ratio limiterd/trivial: throughput", "median of the per-round",
		"limiterd batch 10", "ratio limiterd batch 10/single: decisions/s", "median of the per-round batch/single"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFlagsAreBounded(t *testing.T) {
	for _, args := range [][]string{
		{"--workers", "0"}, {"--workers", "5000"}, {"--duration", "0s"}, {"--duration", "11m"},
		{"--rounds", "0"}, {"--keys", "0"}, {"--max-requests", "0"}, {"stray"},
		{"--batch", "-1"}, {"--batch", "1001"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
