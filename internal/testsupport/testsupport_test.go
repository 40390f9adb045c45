package testsupport

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	Eventually(t, time.Minute, "bool", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Errorf("bool condition called %d times, want 3", calls)
	}
	calls = 0
	Eventually(t, time.Minute, "error", func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("error condition called %d times, want 3", calls)
	}
}

// fatalRecorder records the message of Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (*fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatalMessage runs helper on a recorder, in a goroutine of its own as Fatalf ends it, and
// returns the message the recorder was failed with ("" if none).
func fatalMessage(helper func(testing.TB)) string {
	f := &fatalRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		helper(f)
	}()
	<-done
	return f.msg
}

// failing runs Eventually on a recorder and returns the message it failed with.
func failing[C func() bool | func() error](condition C) string {
	return fatalMessage(func(t testing.TB) { Eventually(t, 20*time.Millisecond, "the thing", condition) })
}

func TestEventuallyFailsNamingWhatAndTheLastError(t *testing.T) {
	if got, want := failing(func() bool { return false }), "the thing: not within 20ms"; got != want {
		t.Errorf("bool: failed with %q, want %q", got, want)
	}
	n := 0
	got := failing(func() error { n++; return fmt.Errorf("attempt %d", n) })
	if want := fmt.Sprintf("the thing: not within 20ms: attempt %d", n); got != want || n < 2 {
		t.Errorf("error: failed with %q after %d attempts, want %q after several", got, n, want)
	}
}

func TestConsistentlyHoldsForTheWholeDuration(t *testing.T) {
	const duration = 50 * time.Millisecond
	calls := 0
	start := time.Now()
	Consistently(t, duration, "bool", func() bool { calls++; return true })
	if elapsed := time.Since(start); elapsed < duration || calls < 2 {
		t.Errorf("bool condition called %d times in %v, want several over at least %v", calls, elapsed, duration)
	}
	calls = 0
	start = time.Now()
	Consistently(t, duration, "error", func() error { calls++; return nil })
	if elapsed := time.Since(start); elapsed < duration || calls < 2 {
		t.Errorf("error condition called %d times in %v, want several over at least %v", calls, elapsed, duration)
	}
}

func TestConsistentlyFailsTheFirstTimeTheConditionDoesNotHold(t *testing.T) {
	// For a minute: the helper must fail at the third call, not at the end of the minute.
	calls := 0
	got := fatalMessage(func(t testing.TB) {
		Consistently(t, time.Minute, "the thing", func() error {
			calls++
			if calls == 3 {
				return fmt.Errorf("attempt %d", calls)
			}
			return nil
		})
	})
	if want := "the thing: did not hold for 1m0s: attempt 3"; got != want || calls != 3 {
		t.Errorf("error: failed with %q after %d calls, want %q after 3", got, calls, want)
	}

	calls = 0
	got = fatalMessage(func(t testing.TB) {
		Consistently(t, time.Minute, "the thing", func() bool { calls++; return calls < 3 })
	})
	if want := "the thing: did not hold for 1m0s"; got != want || calls != 3 {
		t.Errorf("bool: failed with %q after %d calls, want %q after 3", got, calls, want)
	}
}
