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

// failing runs Eventually on a recorder and returns the message it failed with.
func failing[C func() bool | func() error](condition C) string {
	f := &fatalRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Eventually(f, 20*time.Millisecond, "the thing", condition)
	}()
	<-done
	return f.msg
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
