package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryConfig is what the memory flags say: how many bytes of client state limiterd keeps.
type memoryConfig struct {
	maxClientBytes byteSize
	cgroupRoot     string // where the cgroup file systems are mounted; a test points it elsewhere
}

// byteSize is a size flag: bytes, with an optional binary (Ki, Mi, Gi, Ti) or decimal (k, M, G,
// T) suffix, or "auto" (-1).
type byteSize int64

const autoSize byteSize = -1

var sizeSuffixes = []struct {
	suffix string
	factor int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

func (s *byteSize) String() string {
	if *s == autoSize {
		return "auto"
	}
	return strconv.FormatInt(int64(*s), 10)
}

func (s *byteSize) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// parseSize parses a byteSize.
func parseSize(v string) (byteSize, error) {
	if v == "auto" {
		return autoSize, nil
	}
	digits, factor := v, int64(1)
	for _, s := range sizeSuffixes {
		if strings.HasSuffix(v, s.suffix) {
			digits, factor = strings.TrimSuffix(v, s.suffix), s.factor
			break
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 0 || digits == "" || digits[0] < '0' || digits[0] > '9' {
		return 0, fmt.Errorf("want auto, or a number of bytes with an optional suffix (Ki, Mi, Gi, Ti, k, M, G, T), got %q", v)
	}
	if n > (1<<62)/factor {
		return 0, fmt.Errorf("%q is too large", v)
	}
	return byteSize(n * factor), nil
}

// register adds the memory flags to fs.
func (c *memoryConfig) register(fs *flag.FlagSet) {
	c.maxClientBytes = autoSize
	c.cgroupRoot = "/sys/fs/cgroup"
	fs.Var(&c.maxClientBytes, "max-client-bytes",
		"most `bytes` of client state kept in memory, keys included, over all policies (suffixes Ki, Mi, Gi; 0: unbounded); "+
			"auto: half the container's memory limit (cgroup v1 or v2), unbounded without one")
}

// resolve returns the byte bound of client state. Without GOMEMLIMIT in the environment and
// with a container memory limit, it also sets the Go runtime's soft memory limit to 90 % of
// the container's, so that the garbage collector works harder before the kernel kills.
func (c *memoryConfig) resolve(log *slog.Logger) int64 {
	limit, err := cgroupMemoryLimit(c.cgroupRoot)
	if err != nil {
		log.Warn("memory limit unknown", "error", err)
	}
	if limit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(limit / 10 * 9)
	}
	maxBytes := int64(c.maxClientBytes)
	if c.maxClientBytes == autoSize {
		maxBytes = limit / 2
	}
	log.Info("memory", "container_limit_bytes", limit, "max_client_bytes", maxBytes,
		"go_memory_limit_bytes", debug.SetMemoryLimit(-1))
	return maxBytes
}

// unlimitedCgroup is the smallest value a cgroup v1 memory.limit_in_bytes takes for "no limit"
// (the largest page-aligned int64, or near it).
const unlimitedCgroup = 1 << 62

// cgroupMemoryLimit returns the memory limit of the cgroup this process runs in, read from the
// cgroup v2 memory.max or the cgroup v1 memory.limit_in_bytes under root; 0 when there is none.
func cgroupMemoryLimit(root string) (int64, error) {
	for _, file := range []string{"memory.max", "memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(filepath.Join(root, file))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read cgroup memory limit: %w", err)
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("cgroup memory limit %s: %q is not a number of bytes", file, v)
		}
		if n >= unlimitedCgroup {
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}
