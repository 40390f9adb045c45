package replicastatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// MaxChangeDelay bounds how long a change waits to be published: changes are published at
// most once per min(MaxChangeDelay, interval), so that a burst of them (the first sync of many
// ConfigMaps) makes one write.
const MaxChangeDelay = time.Second

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// Namespace is the status namespace, where the Lease lives. Required.
	Namespace string
	// Name is the replica's name, the Lease's name: a DNS subdomain. Required.
	Name string
	// Interval is how often the record is renewed (default DefaultInterval); it lives
	// LeaseDuration(Interval).
	Interval time.Duration
	// Logger receives publishing failures (nil: slog.Default).
	Logger *slog.Logger
	// Clock returns the current time (nil: time.Now).
	Clock func() time.Time
	// PodUID is the UID of the Pod the replica runs in, named Name (empty: the replica is no
	// Pod). The Lease is then owned by the Pod, so that the garbage collector deletes it with
	// the Pod even when the replica cannot (its Role was deleted first, or it was killed).
	PodUID types.UID
}

// Publisher keeps a replica's record in its Lease: it writes the record returned by snapshot
// every interval, and soon after Changed is called.
type Publisher struct {
	leases   coordinationv1client.LeaseInterface
	snapshot func() v1alpha1.ReplicaRecord
	name     string
	interval time.Duration
	duration int32 // seconds
	log      *slog.Logger
	clock    func() time.Time
	changed  chan struct{}
	owner    []metav1.OwnerReference // of the Lease: the replica's Pod; nil: none

	lease *coordinationv1.Lease // as last written; owned by Run
}

// NewPublisher returns a publisher of the records returned by snapshot, written through leases.
func NewPublisher(leases coordinationv1client.LeasesGetter, snapshot func() v1alpha1.ReplicaRecord, opts PublisherOptions) (*Publisher, error) {
	if opts.Namespace == "" {
		return nil, errors.New("replica status: namespace is empty")
	}
	if errs := validation.IsDNS1123Subdomain(opts.Name); len(errs) > 0 {
		return nil, fmt.Errorf("replica status: replica name %q: %v", opts.Name, errs)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	var owner []metav1.OwnerReference
	if opts.PodUID != "" {
		// Not a controller, and blockOwnerDeletion unset: deleting the Pod never waits for the
		// Lease, and setting the reference needs no permission on the Pod.
		owner = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: opts.Name, UID: opts.PodUID}}
	}
	return &Publisher{
		owner:    owner,
		leases:   leases.Leases(opts.Namespace),
		snapshot: snapshot,
		name:     opts.Name,
		interval: opts.Interval,
		duration: int32(LeaseDuration(opts.Interval) / time.Second), // DurationFactor*interval
		log:      opts.Logger.With("namespace", opts.Namespace, "replica", opts.Name),
		clock:    opts.Clock,
		changed:  make(chan struct{}, 1),
	}, nil
}

// Changed asks for the record to be published soon: within min(MaxChangeDelay, interval) of
// the previous write. It never blocks.
func (p *Publisher) Changed() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Run publishes the record at once, then every interval and after changes, until ctx is done;
// then it deletes the Lease, so that the replica stops counting at once. Failures are logged
// and retried; Run returns nil.
func (p *Publisher) Run(ctx context.Context) error {
	gap := min(MaxChangeDelay, p.interval)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var (
		next     time.Time // when the timer fires
		last     time.Time // the last attempt
		failures int
	)
	schedule := func(at time.Time) {
		next = at
		timer.Reset(max(time.Until(at), 0))
	}
	for {
		select {
		case <-ctx.Done():
			p.withdraw()
			return nil
		case <-p.changed:
			if at := last.Add(gap); at.Before(next) {
				schedule(at)
			}
			continue
		case <-timer.C:
		}
		last = time.Now()
		if err := p.publish(ctx); err != nil {
			if ctx.Err() != nil {
				continue // stopping
			}
			failures++
			p.log.Warn("replica status not published", "error", err, "failures", failures)
			if failures == 1 {
				schedule(last.Add(gap))
			} else {
				schedule(last.Add(p.interval))
			}
			continue
		}
		if failures > 0 {
			p.log.Info("replica status published again", "failures", failures)
		}
		failures = 0
		schedule(last.Add(p.interval))
	}
}

// publish writes the current record into the Lease, creating it if needed.
func (p *Publisher) publish(ctx context.Context) error {
	encoded, err := p.snapshot().Encode()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, max(p.interval, 5*time.Second))
	defer cancel()
	if p.lease == nil {
		current, err := p.leases.Get(ctx, p.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: p.name}}
			p.fill(l, encoded)
			created, err := p.leases.Create(ctx, l, metav1.CreateOptions{FieldManager: "limiterd"})
			if err != nil {
				return fmt.Errorf("create lease %s: %w", p.name, err)
			}
			p.lease = created
			return nil
		case err != nil:
			return fmt.Errorf("get lease %s: %w", p.name, err)
		}
		p.lease = current
	}
	l := p.lease.DeepCopy()
	p.fill(l, encoded)
	updated, err := p.leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: "limiterd"})
	if err != nil {
		p.lease = nil // read it again next time: it may have changed or gone
		return fmt.Errorf("update lease %s: %w", p.name, err)
	}
	p.lease = updated
	return nil
}

// fill makes l carry the record and a renewal at the current time.
func (p *Publisher) fill(l *coordinationv1.Lease, encoded string) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[v1alpha1.ReplicaLabel] = p.name
	if p.owner != nil {
		l.OwnerReferences = p.owner
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[v1alpha1.ReplicaStatusAnnotation] = encoded
	now := metav1.NewMicroTime(p.clock())
	name, duration := p.name, p.duration
	l.Spec.HolderIdentity = &name
	l.Spec.LeaseDurationSeconds = &duration
	l.Spec.RenewTime = &now
	if l.Spec.AcquireTime == nil {
		l.Spec.AcquireTime = &now
	}
}

// withdrawTimeout bounds the deletion of the Lease at shutdown.
const withdrawTimeout = 5 * time.Second

// withdraw deletes the replica's Lease by name, whatever the last write did: a renewal that
// failed or was cut short by the shutdown may have left no copy of it, or a stale one, yet the
// Lease (the replica's own, by name) exists and counts the replica until it expires.
func (p *Publisher) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), withdrawTimeout)
	defer cancel()
	err := p.leases.Delete(ctx, p.name, metav1.DeleteOptions{})
	p.lease = nil
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		p.log.Warn("replica status not withdrawn", "error", err)
		return
	}
	p.log.Info("replica status withdrawn")
}
