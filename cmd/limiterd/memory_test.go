package main

import (
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]byteSize{
		"auto": autoSize, "0": 0, "1024": 1024, "64Mi": 64 << 20, "2Gi": 2 << 30, "1k": 1000, "3M": 3e6,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "Mi", "1.5Gi", "+1", "1 Mi", "10Pi", "9999999999Ti", "auto0"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

// FuzzParseSize checks parseSize against a model of its grammar written apart from it (a
// regular expression, the suffixes' factors as powers, big integers for the bound of 2^62
// bytes): the same inputs are accepted, with the same values; and what it accepts reformats
// (String) to a size that parses to the same value.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"auto", "0", "007", "64Mi", "1k", "-1", "+1", "1Ki", "1Gi", "1Ti", "1M", "1G", "1T", "1KiB", "1i",
		"9223372036854775807", "4611686018427387904Ki", "4611686018427387904", "4611686018427387905",
		"4194304Ti", "4194305Ti", "4611686T", "4611687T", "1_000", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		want, ok := modelSize(s)
		switch {
		case ok != (err == nil):
			t.Fatalf("parseSize(%q) = %d, %v; the model says accepted: %t", s, n, err, ok)
		case !ok:
			return
		case n != want:
			t.Fatalf("parseSize(%q) = %d, want %d", s, n, want)
		}
		again, err := parseSize(n.String())
		if err != nil || again != n {
			t.Fatalf("parseSize(%q) = %d; its String %q parses to %d, %v", s, n, n.String(), again, err)
		}
	})
}

// sizeGrammar is the grammar of a size other than auto: decimal digits, then an optional suffix.
var sizeGrammar = regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$`)

// modelSize is the size s stands for, and whether it is one: auto (-1), or digits times the
// suffix's factor (binary: 2^10 to 2^40; decimal: 10^3 to 10^12), at most 2^62 bytes.
func modelSize(s string) (byteSize, bool) {
	if s == "auto" {
		return autoSize, true
	}
	m := sizeGrammar.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	v, _ := new(big.Int).SetString(m[1], 10)
	if m[2] != "" {
		base, exp := int64(2), int64(10*(1+strings.Index("KMGT", m[2][:1])))
		if !strings.HasSuffix(m[2], "i") {
			base, exp = 10, int64(3*(1+strings.Index("kMGT", m[2])))
		}
		v.Mul(v, new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil))
	}
	if v.Cmp(new(big.Int).Lsh(big.NewInt(1), 62)) > 0 {
		return 0, false
	}
	return byteSize(v.Int64()), true
}

func TestCgroupMemoryLimit(t *testing.T) {
	write := func(t *testing.T, root, file, content string) {
		t.Helper()
		path := filepath.Join(root, file)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, file, content string
		want                int64
		wantErr             bool
	}{
		{"v2", "memory.max", "536870912\n", 512 << 20, false},
		{"v2 unlimited", "memory.max", "max\n", 0, false},
		{"v1", "memory/memory.limit_in_bytes", "268435456\n", 256 << 20, false},
		{"v1 unlimited", "memory/memory.limit_in_bytes", "9223372036854771712\n", 0, false},
		{"garbage", "memory.max", "lots\n", 0, true},
		{"none", "other", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.file, tc.content)
			got, err := cgroupMemoryLimit(root)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("cgroupMemoryLimit = %d, %v; want %d, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
	// auto: half the container's limit.
	root := t.TempDir()
	write(t, root, "memory.max", "536870912")
	t.Setenv("GOMEMLIMIT", "1GiB") // keep the test process's own limit
	c := memoryConfig{maxClientBytes: autoSize, cgroupRoot: root}
	if got := c.resolve(slog.New(slog.DiscardHandler)); got != 256<<20 {
		t.Fatalf("auto budget = %d, want 256Mi", got)
	}
}
