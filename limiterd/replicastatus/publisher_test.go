package replicastatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const waitTimeout = 60 * time.Second

// records is a snapshot function whose record the test sets.
type records struct {
	mu  sync.Mutex
	rec v1alpha1.ReplicaRecord
}

func (r *records) set(rec v1alpha1.ReplicaRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec = rec
}

func (r *records) get() v1alpha1.ReplicaRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec
}

// readLease returns the replica's Lease and its record.
func readLease(ctx context.Context, c client.Client, namespace, name string) (*coordinationv1.Lease, v1alpha1.Replica, error) {
	l := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, l); err != nil {
		return nil, v1alpha1.Replica{}, err
	}
	rep, err := v1alpha1.ReplicaFromLease(l)
	return l, rep, err
}

func TestPublisherKeepsItsLease(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	src := &records{rec: v1alpha1.ReplicaRecord{"ns/a": {Generation: 1, State: v1alpha1.ReplicaServing}}}
	logs := &testsupport.SyncBuffer{}
	const interval = 300 * time.Millisecond
	pub, err := NewPublisher(clientset.CoordinationV1(), src.get, PublisherOptions{
		Namespace: ns, Name: "limiterd-0", Interval: interval,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("publisher logs:\n%s", logs)
		}
	})
	bg := t.Context()

	// hasRecord waits until the Lease holds want.
	hasRecord := func(want v1alpha1.ReplicaRecord) *coordinationv1.Lease {
		t.Helper()
		var got *coordinationv1.Lease
		testsupport.Eventually(t, waitTimeout, "record published", func() error {
			l, rep, err := readLease(bg, env.Client, ns, "limiterd-0")
			if err != nil {
				return err
			}
			if fmt.Sprint(rep.Record) != fmt.Sprint(want) {
				return fmt.Errorf("record %v, want %v", rep.Record, want)
			}
			got = l
			return nil
		})
		return got
	}

	first := hasRecord(src.get())
	if h := first.Spec.HolderIdentity; h == nil || *h != "limiterd-0" {
		t.Errorf("holderIdentity %v, want limiterd-0", h)
	}
	if d := first.Spec.LeaseDurationSeconds; d == nil || *d != 1 {
		t.Errorf("leaseDurationSeconds %v, want 1 (3 intervals of 300ms, rounded up)", d)
	}

	t.Run("renews every interval", func(t *testing.T) {
		testsupport.Eventually(t, waitTimeout, "Lease renewed", func() error {
			l, rep, err := readLease(bg, env.Client, ns, "limiterd-0")
			if err != nil {
				return err
			}
			if !l.Spec.RenewTime.After(first.Spec.RenewTime.Time) || !rep.Live(time.Now()) {
				return fmt.Errorf("renewTime %v not after %v, or expired", l.Spec.RenewTime, first.Spec.RenewTime)
			}
			return nil
		})
	})

	t.Run("a change is published soon", func(t *testing.T) {
		// Renewals are due every 300ms anyway; Changed must publish in time even with a long
		// interval, which the next test checks. Here: the new record shows up.
		src.set(v1alpha1.ReplicaRecord{"ns/a": {Generation: 2, State: v1alpha1.ReplicaServing}, "ns/b": {Generation: 1, State: v1alpha1.ReplicaRejected}})
		pub.Changed()
		hasRecord(src.get())
	})

	t.Run("recovers from an edit by someone else", func(t *testing.T) {
		l, _, err := readLease(bg, env.Client, ns, "limiterd-0")
		if err != nil {
			t.Fatal(err)
		}
		l.Annotations[v1alpha1.ReplicaStatusAnnotation] = "{}"
		if err := env.Client.Update(bg, l); err != nil && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
		hasRecord(src.get())
	})

	t.Run("recreates a deleted lease", func(t *testing.T) {
		l, _, err := readLease(bg, env.Client, ns, "limiterd-0")
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Delete(bg, l); err != nil {
			t.Fatal(err)
		}
		recreated := hasRecord(src.get())
		if recreated.UID == l.UID {
			t.Error("lease not recreated")
		}
	})

	t.Run("withdraws its lease when stopped", func(t *testing.T) {
		stop()
		_, _, err := readLease(bg, env.Client, ns, "limiterd-0")
		if !apierrors.IsNotFound(err) {
			t.Errorf("lease after Run returned: %v, want not found", err)
		}
	})
}

func TestPublisherPublishesChangesBeforeTheInterval(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	src := &records{rec: v1alpha1.ReplicaRecord{}}
	pub, err := NewPublisher(clientset.CoordinationV1(), src.get, PublisherOptions{
		Namespace: ns, Name: "limiterd-1", Interval: time.Hour, Logger: slog.New(slog.NewJSONHandler(&testsupport.SyncBuffer{}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	testsupport.Eventually(t, waitTimeout, "Lease limiterd-1 created", func() error {
		_, _, err := readLease(t.Context(), env.Client, ns, "limiterd-1")
		return err
	})
	want := v1alpha1.ReplicaRecord{"ns/a": {Generation: 7, State: v1alpha1.ReplicaServing}}
	src.set(want)
	pub.Changed()
	// Within MaxChangeDelay (and a renewal is an hour away); the API round trips get a margin.
	deadline := time.Now().Add(MaxChangeDelay + 5*time.Second)
	for {
		_, rep, err := readLease(t.Context(), env.Client, ns, "limiterd-1")
		if err == nil && fmt.Sprint(rep.Record) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("change not published within %v: %v, %v", MaxChangeDelay+5*time.Second, rep.Record, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewPublisherChecksItsOptions(t *testing.T) {
	for name, opts := range map[string]PublisherOptions{
		"no namespace": {Name: "a"},
		"no name":      {Namespace: "ns"},
		"invalid name": {Namespace: "ns", Name: "Upper_Case"},
	} {
		if _, err := NewPublisher(nil, func() v1alpha1.ReplicaRecord { return nil }, opts); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// interruptedRenewals is a Lease client whose next Update, once armed, first cancels the
// publisher's context: the SIGTERM that lands during a renewal.
type interruptedRenewals struct {
	coordinationv1client.LeasesGetter
	armed  atomic.Bool
	cancel context.CancelFunc
	hit    chan struct{}
}

func (r *interruptedRenewals) Leases(namespace string) coordinationv1client.LeaseInterface {
	return interruptedLeases{LeaseInterface: r.LeasesGetter.Leases(namespace), r: r}
}

type interruptedLeases struct {
	coordinationv1client.LeaseInterface
	r *interruptedRenewals
}

func (l interruptedLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.r.armed.CompareAndSwap(true, false) {
		l.r.cancel()
		<-ctx.Done() // the renewal's context ends with the publisher's
		defer close(l.r.hit)
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}

// TestWithdrawAfterAnInterruptedRenewal stops the publisher during a renewal, which then fails:
// the Lease is withdrawn all the same, so that the replica stops counting at once.
func TestWithdrawAfterAnInterruptedRenewal(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	leases := &interruptedRenewals{LeasesGetter: clientset.CoordinationV1(), cancel: cancel, hit: make(chan struct{})}
	logs := &testsupport.SyncBuffer{}
	src := &records{rec: v1alpha1.ReplicaRecord{"ns/a": {Generation: 1, State: v1alpha1.ReplicaServing}}}
	pub, err := NewPublisher(leases, src.get, PublisherOptions{
		Namespace: ns, Name: "limiterd-2", Interval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pub.Run(ctx) }()
	testsupport.Eventually(t, waitTimeout, "Lease limiterd-2 created", func() error {
		_, _, err := readLease(t.Context(), env.Client, ns, "limiterd-2")
		return err
	})
	leases.armed.Store(true)
	<-leases.hit
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, _, err := readLease(t.Context(), env.Client, ns, "limiterd-2"); !apierrors.IsNotFound(err) {
		t.Errorf("lease after a renewal interrupted by the shutdown: %v, want not found\nlogs:\n%s", err, logs)
	}
}

// TestLeaseOwnedByItsPod checks that with PodUID the Lease is owned by the replica's Pod, also
// when it existed before without an owner, so that it goes with the Pod.
func TestLeaseOwnedByItsPod(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	bg := t.Context()
	pod, err := clientset.CoreV1().Pods(ns).Create(bg, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "limiterd-3"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "limiterd", Image: "limiterd"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	// A Lease left by a version that set no owner.
	if _, err := clientset.CoordinationV1().Leases(ns).Create(bg, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Labels: map[string]string{v1alpha1.ReplicaLabel: pod.Name}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, existing := range []bool{true, false} {
		if !existing {
			// Withdrawn when the first publisher stopped; make sure.
			if err := clientset.CoordinationV1().Leases(ns).Delete(bg, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		src := &records{rec: v1alpha1.ReplicaRecord{"ns/a": {Generation: 1, State: v1alpha1.ReplicaServing}}}
		pub, err := NewPublisher(clientset.CoordinationV1(), src.get, PublisherOptions{
			Namespace: ns, Name: pod.Name, PodUID: pod.UID, Interval: time.Hour,
			Logger: slog.New(slog.NewJSONHandler(&testsupport.SyncBuffer{}, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		done := make(chan error, 1)
		go func() { done <- pub.Run(ctx) }()
		testsupport.Eventually(t, waitTimeout, "Lease owned by its Pod", func() error {
			l, rep, err := readLease(bg, env.Client, ns, pod.Name)
			switch {
			case err != nil:
				return err
			case len(rep.Record) == 0:
				return errors.New("no record yet")
			case fmt.Sprint(l.OwnerReferences) != fmt.Sprint(want):
				return fmt.Errorf("lease (existing %t) owned by %v, want %v", existing, l.OwnerReferences, want)
			}
			return nil
		})
		cancel()
		<-done
	}
}
