//go:build !race

package limiter_test

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// statusBytes returns a size field of /proc/self/status (VmRSS, VmHWM) in bytes.
func statusBytes(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, rest, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// A flood of 300k distinct 1,000-byte keys (300 MB of keys) keeps the process under a 160 MiB
// memory limit configured as limiterd derives it from a container's: client state bounded to
// half of it, the Go runtime's soft limit at 90 %. The evictions are counted. Like every test of
// this file it runs without -race, whose shadow memory would count in RSS: make test-memory,
// which make test runs.
func TestByteBudgetBoundsRSSUnderALongKeyFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 300 MB of keys")
	}
	const (
		containerLimit = 160 << 20
		keys           = 300_000
		keyLen         = 1000
	)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(containerLimit / 10 * 9))
	budget := limiter.NewBudget(0, containerLimit/2)
	m := limiter.NewMemory(budget)
	tb := limitertest.One(mustTB(t, 10, 1, time.Hour))
	now := limitertest.T0
	key := []byte(strings.Repeat("k", keyLen))
	// The kernel's high-water mark (VmHWM) is the exact peak, which sampling VmRSS can miss
	// between two samples; writing 5 to clear_refs resets it to the current RSS (Linux 4.0+), so
	// that it covers this flood, not the tests the binary ran before.
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Logf("VmHWM not reset (%v): the peak covers the whole test binary", err)
	}
	for i := range keys {
		copy(key, strconv.Itoa(i)) // a fresh string each time, as a request's key would be
		m.Decide(t.Context(), string(key), tb, now, 1, nil)
		if budget.Bytes() > containerLimit/2+keyLen+64 {
			t.Fatalf("after %d keys the budget holds %d bytes, bound %d", i+1, budget.Bytes(), containerLimit/2)
		}
	}
	peak := statusBytes(t, "VmHWM")
	t.Logf("%d keys of %d bytes: %d clients kept, %d bytes accounted, %d evictions, peak RSS %.1f MiB (limit %d MiB)",
		keys, keyLen, budget.Tracked(), budget.Bytes(), budget.Evictions(), float64(peak)/(1<<20), containerLimit>>20)
	if peak >= containerLimit {
		t.Fatalf("peak RSS %d bytes over the %d-byte limit", peak, containerLimit)
	}
	if kept := budget.Tracked(); budget.Evictions() != keys-kept {
		t.Fatalf("evictions %d, want %d (every key but the %d kept had usage)", budget.Evictions(), keys-kept, kept)
	}
	// The accounting against the heap. The runtime's soft limit holds RSS near 90 % of the limit
	// whatever the store keeps, which hides an accounting that under-counts by up to about a
	// third from the bound above; after a collection, the live heap is the kept clients and little
	// else, and it must be within 8 % of the bytes accounted for them (about 3 % over, measured).
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	runtime.KeepAlive(m)
	live, accounted := int64(ms.HeapAlloc), budget.Bytes()
	t.Logf("live heap %.1f MiB after a collection, %.1f MiB accounted", float64(live)/(1<<20), float64(accounted)/(1<<20))
	if live > accounted/100*108 {
		t.Fatalf("live heap %d bytes, over the %d bytes accounted by more than 8 %%", live, accounted)
	}
}
