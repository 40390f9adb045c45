package main

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"testing"
)

// TestRun runs a short, small load against both in-process servers on loopback, and checks
// that every target made decisions, in every round, at some CPU time per decision, and that no
// call failed: labels alone would print with 0 decisions/s, or with every call failing (a
// forward-auth request whose key limiterd does not find answers 429 without a RateLimit field,
// which counts as a failure, and one of a policy without spec.gateway 409).
func TestRun(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--workers", "2", "--duration", "200ms", "--warmup", "0s", "--rounds", "2", "--keys", "50", "--max-requests", "2000", "--batch", "10"}
	if err := run(args, &out, io.Discard); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, want := range []string{"GOMAXPROCS=", "ratio limiterd/trivial: throughput", "median of the per-round",
		"ratio limiterd batch 10/single: decisions/s", "median of the per-round batch/single",
		"ratio forward-auth/allow: decisions/s", "median of the per-round forward-auth/allow ratios: decisions/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	rows := summary(t, out.String())
	for name, perCall := range map[string]int{"trivial": 1, "limiterd": 1, "limiterd batch 10": 10, "limiterd forward-auth": 1} {
		row, ok := rows[name]
		if !ok {
			t.Errorf("the summary has no row for %s:\n%s", name, out.String())
			continue
		}
		if row.perCall != perCall {
			t.Errorf("%s: %d decisions a call, want %d", name, row.perCall, perCall)
		}
		if row.rate <= 0 || row.calls <= 0 {
			t.Errorf("%s: %v decisions/s in %d calls, want some", name, row.rate, row.calls)
		}
		if row.cpu <= 0 {
			t.Errorf("%s: %vµs CPU time a decision, want some", name, row.cpu)
		}
		if row.errors != 0 {
			t.Errorf("%s: %d calls failed, want none", name, row.errors)
		}
	}
	if rounds := roundRates(t, out.String()); len(rounds) != 2*4 {
		t.Errorf("%d per-round lines, want 2 rounds of 4 targets:\n%s", len(rounds), out.String())
	} else {
		for line, rate := range rounds {
			if rate <= 0 {
				t.Errorf("%q: no decisions in a round", line)
			}
		}
	}
}

// summaryRow is one target's row of the summary table run prints.
type summaryRow struct {
	perCall, calls, errors int
	rate                   float64 // decisions/s
	cpu                    float64 // µs a decision
}

// summary parses the summary table of run's output (a header line "target decisions/call
// decisions/s calls/s CPU/decision p50/call p99/call calls errors", then a row per target,
// whose name may hold spaces) into its rows by target.
func summary(t *testing.T, out string) map[string]summaryRow {
	t.Helper()
	const columns = 9
	rows := map[string]summaryRow{}
	header := false
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if !header {
			header = len(f) == columns && f[0] == "target" && f[columns-1] == "errors"
			continue
		}
		if len(f) < columns || f[0] == "ratio" {
			break
		}
		n := len(f) - (columns - 1) // the name's words
		var row summaryRow
		var errs [5]error
		row.perCall, errs[0] = strconv.Atoi(f[n])
		row.rate, errs[1] = strconv.ParseFloat(f[n+1], 64)
		row.cpu, errs[2] = strconv.ParseFloat(strings.TrimSuffix(f[n+3], "µs"), 64)
		row.calls, errs[3] = strconv.Atoi(f[n+6])
		row.errors, errs[4] = strconv.Atoi(f[n+7])
		for _, err := range errs {
			if err != nil {
				t.Fatalf("summary row %q: %v", line, err)
			}
		}
		rows[strings.Join(f[:n], " ")] = row
	}
	if !header {
		t.Fatalf("the output has no summary table:\n%s", out)
	}
	return rows
}

// roundRates returns the decisions/s of every per-round line of run's output ("round 1
// limiterd  1234 decisions/s  56.7 µs CPU/decision"), by line.
func roundRates(t *testing.T, out string) map[string]float64 {
	t.Helper()
	rates := map[string]float64{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 7 || f[0] != "round" || f[len(f)-4] != "decisions/s" {
			continue
		}
		rate, err := strconv.ParseFloat(f[len(f)-5], 64)
		if err != nil {
			t.Fatalf("round line %q: %v", line, err)
		}
		rates[strings.TrimSpace(line)] = rate
	}
	return rates
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
