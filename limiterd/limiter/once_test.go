package limiter

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func recordID(n uint64) [16]byte {
	var id [16]byte
	binary.BigEndian.PutUint64(id[8:], n)
	return id
}

// TestRefundRecordsMatchAModel checks the records against a plain map over random adds and
// sweeps: an ID is refused as refunded exactly while its until has not passed, and the records
// kept are exactly the unexpired ones.
func TestRefundRecordsMatchAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var r refundRecords
	model := map[[16]byte]int64{}
	now := time.Unix(1_700_000_000, 0)
	for step := range 20_000 {
		now = now.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
		if rng.IntN(100) == 0 {
			r.sweep(now)
		}
		id := recordID(uint64(rng.IntN(2_000)))
		until := now.Add(time.Duration(1+rng.IntN(5_000)) * time.Millisecond)
		err := r.add(id, until, now)
		if u, ok := model[id]; ok && u > now.UnixNano() {
			if !errors.Is(err, ErrRefunded) {
				t.Fatalf("step %d: add of a recorded ID: %v, want ErrRefunded", step, err)
			}
		} else {
			if err != nil {
				t.Fatalf("step %d: add of a new ID: %v", step, err)
			}
			model[id] = until.UnixNano()
		}
		for id, u := range model {
			if u <= now.UnixNano() {
				delete(model, id)
			}
		}
		if got := r.len(); got != len(model) {
			t.Fatalf("step %d: %d records, want %d", step, got, len(model))
		}
	}
}

// TestRefundRecordsRefuseAtTheCapCheaply fills the records and checks that a refund past the cap
// is refused with ErrTooManyRefunds without forgetting a record or allocating, and that records
// are taken again once some expire. (What a refusal costs is BenchmarkRefundRecordsRefusedAtTheCap.)
func TestRefundRecordsRefuseAtTheCapCheaply(t *testing.T) {
	var r refundRecords
	now := time.Unix(1_700_000_000, 0)
	for i := range MaxRefundRecords {
		// The first record expires first; the rest an hour later.
		until := now.Add(time.Hour)
		if i == 0 {
			until = now.Add(time.Second)
		}
		if err := r.add(recordID(uint64(i)), until, now); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("add past the cap: %v, want ErrTooManyRefunds", err)
	}
	if err := r.add(recordID(7), now.Add(time.Hour), now); !errors.Is(err, ErrRefunded) {
		t.Fatalf("a record was forgotten at the cap: %v, want ErrRefunded", err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		_ = r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now)
	})
	if allocs != 0 {
		t.Errorf("a refusal at the cap allocates %v times", allocs)
	}
	later := now.Add(2 * time.Second)
	if err := r.add(recordID(MaxRefundRecords), later.Add(time.Hour), later); err != nil {
		t.Fatalf("add once a record expired: %v", err)
	}
	if err := r.add(recordID(0), later.Add(time.Hour), later); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("second add with one record freed: %v, want ErrTooManyRefunds", err)
	}
}

// BenchmarkRefundRecordsRefusedAtTheCap measures a refused refund on full records, none
// expired: before the expiry heap every refusal swept the whole set.
func BenchmarkRefundRecordsRefusedAtTheCap(b *testing.B) {
	var r refundRecords
	now := time.Unix(1_700_000_000, 0)
	for i := range MaxRefundRecords {
		_ = r.add(recordID(uint64(i)), now.Add(time.Hour), now)
	}
	b.ResetTimer()
	for b.Loop() {
		_ = r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now)
	}
}
