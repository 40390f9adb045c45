package main

import (
	"log/slog"
	"os"
	"path/filepath"
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

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"auto", "0", "64Mi", "1k", "-1", "9223372036854775807", "4611686018427387904Ki"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && n < 0 && n != autoSize {
			t.Fatalf("parseSize(%q) = %d", s, n)
		}
	})
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
