package redis

import (
	"math/bits"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// writeExpiredLog writes a sliding window's log of n entries, one unit a millisecond from
// limitertest.T0, as the script would have written it for sw, at key.
func writeExpiredLog(t testing.TB, c *Client, key string, sw *limiter.SlidingWindow, n int) {
	t.Helper()
	writeLog(t, c, key, sw, limitertest.T0, n)
}

// writeLog writes a sliding window's log of n entries, one unit a millisecond from the instant
// from, as the script would have written it for sw, at key (which must not exist), with the
// plain fingerprint for head (the previous release's layout, which this one reads too).
func writeLog(t testing.TB, c *Client, key string, sw *limiter.SlidingWindow, from time.Time, n int) {
	t.Helper()
	writeEntries(t, c, key, sw, from, n, func(i int) time.Duration { return time.Duration(i) * time.Millisecond })
}

// writeEntries writes as writeLog does a log of n entries of one unit, entry i at from + at(i)
// (at must not decrease).
func writeEntries(t testing.TB, c *Client, key string, sw *limiter.SlidingWindow, from time.Time, n int, at func(i int) time.Duration) {
	t.Helper()
	cn, err := c.get()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{c.prepare(sw).fp, strconv.FormatInt(from.Unix(), 10), "0"}
	flush := func() {
		if err := cn.Do(t.Context(), cn.B().Rpush().Key(key).Element(args...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		args = args[:0]
	}
	for i := range n {
		args = append(args, strconv.FormatInt(int64(from.Nanosecond())+int64(at(i)), 10), strconv.Itoa(i+1))
		if len(args) >= 2000 {
			flush()
		}
	}
	flush()
}

// lindexCalls returns the LINDEX calls Redis counted (scripts' included) since the last
// CONFIG RESETSTAT.
func lindexCalls(t testing.TB, srv *redistest.Server) int {
	t.Helper()
	stat := srv.Info(t, "commandstats", "cmdstat_lindex") // calls=N,usec=...
	calls, _, _ := strings.Cut(strings.TrimPrefix(stat, "calls="), ",")
	n, _ := strconv.Atoi(calls) // absent: none
	return n
}

// TestPeekExpiredLogReadsLogN peeks, as a single limit and as a stack's limit, at a sliding
// window whose log holds 20,000 expired entries: the scripts read O(log n) entries to find the
// live ones (counted as LINDEX calls by Redis), and answer as limiter.Memory answers a client
// whose window is empty. Before, each peek read every expired entry, and never trimmed them: a
// peek on 99,999 expired entries took 0.86-1.4 s of Redis time.
func TestPeekExpiredLogReadsLogN(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Clock: CallerClock, Timeout: 5 * time.Second})
	s := c.Store(t.Name())
	const n = 20_000
	sw := slidingWindow(t, 100_000, time.Minute)
	st := limitertest.Stack("burst", tokenBucket(t, 5, 1, time.Second), "log", sw)
	writeExpiredLog(t, c, Key(t.Name(), "single"), sw, n)
	writeExpiredLog(t, c, LimitKey(t.Name(), "stacked", "log"), sw, n)
	// Every entry expired: the newest at n ms, the window one minute.
	now := limitertest.T0.Add(time.Hour)
	bound := 2*bits.Len(n) + 8 // two searches, the newest entry, slack
	mem := limiter.NewMemory(nil)
	want, _ := mem.Decide(t.Context(), "single", limitertest.One(sw), now, 0, nil)

	srv.Do(t, "CONFIG", "RESETSTAT")
	got, err := s.Decide(t.Context(), "single", limitertest.One(sw), now, 0, nil)
	if err != nil || got != want {
		t.Fatalf("peek: %+v, %v; want %+v", got, err, want)
	}
	if calls := lindexCalls(t, srv); calls > bound {
		t.Errorf("a peek on %d expired entries read %d of them (LINDEX), want at most %d", n, calls, bound)
	}

	srv.Do(t, "CONFIG", "RESETSTAT")
	out := make([]limiter.Decision, st.Len())
	wantOut := make([]limiter.Decision, st.Len())
	wantStack, _ := mem.Decide(t.Context(), "stacked", st, now, 0, wantOut)
	gotStack, err := s.Decide(t.Context(), "stacked", st, now, 0, out)
	if err != nil || gotStack != wantStack || out[1] != wantOut[1] {
		t.Fatalf("stacked peek: %+v %+v, %v; want %+v %+v", gotStack, out, err, wantStack, wantOut)
	}
	if calls := lindexCalls(t, srv); calls > bound {
		t.Errorf("a stacked peek on %d expired entries read %d of them (LINDEX), want at most %d", n, calls, bound)
	}

	// A decision then trims the expired entries.
	if d, err := s.Decide(t.Context(), "single", limitertest.One(sw), now, 1, nil); err != nil || !d.Allowed {
		t.Fatalf("decide: %+v, %v", d, err)
	}
	if l := do(t, c, "LLEN", Key(t.Name(), "single")); l != "5" {
		t.Errorf("after a decision the log holds %s elements, want 5 (a header of 3, one entry)", l)
	}
}

// BenchmarkPeekExpiredLog peeks at a sliding window whose log holds 100,000 expired entries
// (single limit and stacked): the time is Redis's search for the live entries.
func BenchmarkPeekExpiredLog(b *testing.B) {
	srv := redistest.Start(b)
	c, err := New(Options{Addrs: []string{srv.Addr()}, Clock: CallerClock, Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s := c.Store(b.Name())
	sw, _ := limiter.NewSlidingWindow(100_000, time.Minute)
	tb, _ := limiter.NewTokenBucket(5, 1, time.Second)
	st := limitertest.Stack("burst", tb, "log", sw)
	const n = 100_000
	writeExpiredLog(b, c, Key(b.Name(), "single"), sw, n)
	writeExpiredLog(b, c, LimitKey(b.Name(), "stacked", "log"), sw, n)
	now := limitertest.T0.Add(time.Hour)
	b.Run("single", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Decide(b.Context(), "single", limitertest.One(sw), now, 0, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stacked", func(b *testing.B) {
		out := make([]limiter.Decision, st.Len())
		for b.Loop() {
			if _, err := s.Decide(b.Context(), "stacked", st, now, 0, out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDecideOnLiveLogReadsItsHead decides on a sliding window whose log of 20,000 entries, one
// unit a millisecond, has its oldest k entries out of the window: the script finds the live
// ones by reading from the log's head, O(log k) entries (counted as LINDEX calls by Redis),
// not O(log n) from its middle, and answers on the n-k units in the window. Before, each of
// these decisions read 17 or 18 entries.
func TestDecideOnLiveLogReadsItsHead(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Clock: CallerClock, Timeout: 5 * time.Second})
	s := c.Store(t.Name())
	const n, limit = 20_000, 100_000
	sw := slidingWindow(t, limit, time.Minute)
	for _, k := range []int{0, 1, 6, 20} {
		client := "k" + strconv.Itoa(k)
		writeExpiredLog(t, c, Key(t.Name(), client), sw, n)
		// Entry i is at T0 + i ms: entries 0 to k-1 left the window at now.
		now := limitertest.T0.Add(time.Minute + time.Duration(k-1)*time.Millisecond)
		// The newest entry (2 reads), the running total before the first live entry, and the
		// search from the head: a gallop, then a bisection, of about bits.Len(k) reads each.
		bound := 2 + 1 + 1 + 2*bits.Len(uint(k))
		srv.Do(t, "CONFIG", "RESETSTAT")
		d, err := s.Decide(t.Context(), client, limitertest.One(sw), now, 1, nil)
		if err != nil || !d.Allowed || d.Remaining != limit-(n-int64(k))-1 {
			t.Fatalf("k=%d: decide: %+v, %v; want admitted with %d remaining", k, d, err, limit-(n-int64(k))-1)
		}
		if calls := lindexCalls(t, srv); calls > bound {
			t.Errorf("a decision on a log of %d entries, %d of them expired, read %d of them (LINDEX), want at most %d", n, k, calls, bound)
		}
	}
}

// scriptCommands returns the commands Redis counted since the last CONFIG RESETSTAT that a
// script called, by name: every command but the test's and the client's own (EVALSHA, EVAL,
// SCRIPT LOAD, CONFIG, INFO, and HELLO or CLIENT of a connection the client makes meanwhile).
func scriptCommands(t testing.TB, srv *redistest.Server) map[string]int {
	t.Helper()
	calls := map[string]int{}
	for _, line := range strings.Split(srv.Do(t, "INFO", "commandstats"), "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		switch {
		case name == "evalsha", name == "eval", name == "info", strings.HasPrefix(name, "config|"),
			strings.HasPrefix(name, "script|"),
			name == "hello", strings.HasPrefix(name, "client|"):
			continue
		}
		n, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(value, "calls="), ",", 2)[0])
		if err != nil {
			t.Fatalf("INFO commandstats %s: %v", line, err)
		}
		calls[name] = n
	}
	return calls
}

// TestSlidingWindowDecisionCommands decides on a sliding window whose log holds 3,000 entries
// and counts the commands the script calls (Redis counts a script's calls in INFO
// commandstats): issue 36 allows 6 a decision, on the server's clock (TIME) as on the caller's.
// Each answer is limiter.Memory's on the same log.
//   - None to two of the oldest entries out of the window (the common case): at most 4 on the
//     caller's clock, 5 on the server's (its TIME more), on a log whose head is the plain
//     fingerprint (the previous release's layout: the tail read) and on one whose head carries
//     the newest entry (the head rewritten instead). Before, 7 with none expired, 12 to 14 with
//     one to three.
//   - A stream of decisions, one a millisecond, each one entry more out of the window: an
//     admission drops the expired entries once there are 3, with the rewrite of the head that
//     carries the newest entry (not read from the tail then): at most 5 each on the caller's
//     clock. The previous release's took 6 to drop, 7 on the server's clock.
//   - On the server's clock, a log with 4 entries out of the window: the first decision makes
//     the head carry the newest entry (6 with TIME), the second drops them (6).
//   - A short log, whose first read holds it whole: at most 3, as before.
func TestSlidingWindowDecisionCommands(t *testing.T) {
	const n, limit = 3000, 100_000
	count := func(calls map[string]int) (total int) {
		for _, c := range calls {
			total += c
		}
		return total
	}
	t.Run("CallerClock", func(t *testing.T) {
		srv := redistest.Start(t)
		c := newClient(t, Options{Addrs: []string{srv.Addr()}, Clock: CallerClock, Timeout: 5 * time.Second})
		s := c.Store(t.Name())
		sw := slidingWindow(t, limit, time.Minute)
		for _, k := range []int{0, 1, 2} {
			client := "k" + strconv.Itoa(k)
			writeExpiredLog(t, c, Key(t.Name(), client), sw, n)
			// Entry i is at T0 + i ms: entries 0 to k-1 left the window at now.
			now := limitertest.T0.Add(time.Minute + time.Duration(k-1)*time.Millisecond)
			for i := range 3 { // at one instant: the first appends, the others add to its entry
				srv.Do(t, "CONFIG", "RESETSTAT")
				d, err := s.Decide(t.Context(), client, limitertest.One(sw), now, 1, nil)
				want := limit - (n - int64(k)) - 1 - int64(i)
				if err != nil || !d.Allowed || d.Remaining != want {
					t.Fatalf("k=%d, decision %d: %+v, %v; want admitted with %d remaining", k, i, d, err, want)
				}
				if calls := scriptCommands(t, srv); count(calls) > 4 {
					t.Errorf("k=%d, decision %d on a log of %d entries called %d commands %v, want at most 4", k, i, n, count(calls), calls)
				}
			}
		}

		// The stream: decision i at T0 + 1 min + i ms, when entries 0 to i left the window.
		key := Key(t.Name(), "stream")
		writeExpiredLog(t, c, key, sw, n)
		const decisions = 30
		mem := limiter.NewMemory(nil)
		for i := range n { // the log writeExpiredLog wrote
			if d, err := mem.Decide(t.Context(), "stream", limitertest.One(sw), limitertest.T0.Add(time.Duration(i)*time.Millisecond), 1, nil); err != nil || !d.Allowed {
				t.Fatalf("memory: %+v, %v", d, err)
			}
		}
		for i := range decisions + 2 { // the last 3 at one instant
			now := limitertest.T0.Add(time.Minute + time.Duration(min(i, decisions-1))*time.Millisecond)
			srv.Do(t, "CONFIG", "RESETSTAT")
			want, _ := mem.Decide(t.Context(), "stream", limitertest.One(sw), now, 1, nil)
			d, err := s.Decide(t.Context(), "stream", limitertest.One(sw), now, 1, nil)
			if err != nil || d != want {
				t.Fatalf("stream decision %d: %+v, %v; want %+v", i, d, err, want)
			}
			calls := scriptCommands(t, srv)
			bound := 5
			if i >= decisions { // on its own instant's entry, none expired since
				bound = 4
			}
			if count(calls) > bound {
				t.Errorf("stream decision %d on a log of %d entries, one more expired each, called %d commands %v, want at most %d", i, n, count(calls), calls, bound)
			}
		}
		// n entries live (decisions entries more, as many expired), at most 2 expired kept.
		l, _ := strconv.Atoi(do(t, c, "LLEN", key))
		if expired := (l-3)/2 - n; expired < 0 || expired > 2 {
			t.Errorf("after the stream the log holds %d elements, want %d entries live and at most 2 expired", l, n)
		}
		if head := do(t, c, "LINDEX", key, "0"); !carriedHead.MatchString(head) {
			t.Errorf("after the stream the log's head is %q, want one that carries the newest entry", head)
		}

		// A short log: fresh, then up to 6 entries, each decision at an instant of its own.
		for i := range 6 {
			srv.Do(t, "CONFIG", "RESETSTAT")
			if d, err := s.Decide(t.Context(), "short", limitertest.One(sw), limitertest.T0.Add(time.Duration(i)*time.Millisecond), 1, nil); err != nil || !d.Allowed {
				t.Fatalf("short log, decision %d: %+v, %v", i, d, err)
			}
			if calls := scriptCommands(t, srv); count(calls) > 3 {
				t.Errorf("decision %d on a short log called %d commands %v, want at most 3", i, count(calls), calls)
			}
		}
	})
	t.Run("ServerClock", func(t *testing.T) {
		srv := redistest.Start(t)
		c := newClient(t, Options{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second})
		s := c.Store(t.Name())
		sw := slidingWindow(t, limit, time.Hour)
		// n entries over the 3 s before a second ago, in a window of an hour: none expired.
		writeLog(t, c, Key(t.Name(), "c"), sw, time.Now().Add(-4*time.Second), n)
		for i := range 3 {
			srv.Do(t, "CONFIG", "RESETSTAT")
			d, err := s.Decide(t.Context(), "c", limitertest.One(sw), time.Time{}, 1, nil)
			if want := limit - n - 1 - int64(i); err != nil || !d.Allowed || d.Remaining != want {
				t.Fatalf("decision %d: %+v, %v; want admitted with %d remaining", i, d, err, want)
			}
			if calls := scriptCommands(t, srv); count(calls) > 5 || calls["time"] != 1 {
				t.Errorf("decision %d on a log of %d entries called %d commands %v, want at most 5, TIME once", i, n, count(calls), calls)
			}
		}

		// 4 entries two hours ago, then n-4 over the 3 s before a second ago: 4 expired.
		const expired = 4
		key := Key(t.Name(), "drops")
		from := time.Now().Add(-2 * time.Hour)
		writeEntries(t, c, key, sw, from, n, func(i int) time.Duration {
			if i < expired {
				return time.Duration(i) * time.Millisecond
			}
			return 2*time.Hour - 4*time.Second + time.Duration(i)*time.Millisecond
		})
		for i := range 4 {
			srv.Do(t, "CONFIG", "RESETSTAT")
			d, err := s.Decide(t.Context(), "drops", limitertest.One(sw), time.Time{}, 1, nil)
			if want := limit - (n - expired) - 1 - int64(i); err != nil || !d.Allowed || d.Remaining != want {
				t.Fatalf("decision %d: %+v, %v; want admitted with %d remaining", i, d, err, want)
			}
			if calls := scriptCommands(t, srv); count(calls) > 6 || calls["time"] != 1 {
				t.Errorf("decision %d on a log of %d entries, %d expired, called %d commands %v, want at most 6, TIME once", i, n, expired, count(calls), calls)
			}
		}
		// The expired entries dropped: n-4 live entries and 4 more.
		if l := do(t, c, "LLEN", key); l != strconv.Itoa(3+2*(n-expired+4)) {
			t.Errorf("after the decisions the log holds %s elements, want %d", l, 3+2*(n-expired+4))
		}
	})
}
