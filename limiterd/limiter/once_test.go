package limiter

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
)

func recordID(n uint64) [16]byte {
	var id [16]byte
	binary.BigEndian.PutUint64(id[8:], n)
	return id
}

// TestRefundRecordsMatchAModel checks the records against a plain map over random adds and
// sweeps, some at instants behind the newest (a refund delayed since it read the clock): an ID
// is refused as refunded exactly while its until and RefundRecordGrace have not passed at the
// newest instant seen, an add more than the grace behind it is refused as too late, and the
// records kept are exactly the unexpired ones.
func TestRefundRecordsMatchAModel(t *testing.T) {
	rng := testseed.Rand(t, 2)
	var r refundRecords
	model := map[[16]byte]int64{}
	var newest int64
	base := time.Unix(1_700_000_000, 0)
	late := 0
	prune := func() {
		for id, u := range model {
			if u+int64(RefundRecordGrace) <= newest {
				delete(model, id)
			}
		}
	}
	for step := range 20_000 {
		base = base.Add(time.Duration(rng.IntN(50)) * time.Millisecond)
		now := base
		if rng.IntN(20) == 0 {
			now = base.Add(-time.Duration(rng.Int64N(int64(RefundRecordGrace + 2*time.Second))))
		}
		if rng.IntN(100) == 0 {
			r.sweep(base)
			newest = max(newest, base.UnixNano())
			prune()
		}
		id := recordID(uint64(rng.IntN(2_000)))
		until := now.Add(time.Duration(1+rng.IntN(5_000)) * time.Millisecond)
		err := r.add(id, until, now, false)
		if now.UnixNano() < newest-int64(RefundRecordGrace) {
			if !errors.Is(err, ErrRefundTooLate) {
				t.Fatalf("step %d: add %v behind the newest instant: %v, want ErrRefundTooLate", step, time.Duration(newest-now.UnixNano()), err)
			}
			late++
		} else {
			newest = max(newest, now.UnixNano())
			prune()
			if _, ok := model[id]; ok {
				if !errors.Is(err, ErrRefunded) {
					t.Fatalf("step %d: add of a recorded ID: %v, want ErrRefunded", step, err)
				}
			} else {
				if err != nil {
					t.Fatalf("step %d: add of a new ID: %v", step, err)
				}
				model[id] = until.UnixNano()
			}
		}
		if got := r.len(); got != len(model) {
			t.Fatalf("step %d: %d records, want %d", step, got, len(model))
		}
	}
	if late == 0 {
		t.Fatal("no add was too late: the model test misses a case")
	}
}

// TestRefundRecordsRefuseAtTheCapCheaply fills the records and checks that a refund past the cap
// is refused with ErrTooManyRefunds without forgetting a record or allocating, and that records
// are taken again once some expire. (What a refusal costs is BenchmarkRefundRecordsRefusedAtTheCap.)
func TestRefundRecordsRefuseAtTheCapCheaply(t *testing.T) {
	var r refundRecords
	now := time.Unix(1_700_000_000, 0)
	for i := range MaxRefundRecords {
		// The first record expires first (with the grace); the rest an hour later.
		until := now.Add(time.Hour)
		if i == 0 {
			until = now.Add(time.Second)
		}
		if err := r.add(recordID(uint64(i)), until, now, false); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now, false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("add past the cap: %v, want ErrTooManyRefunds", err)
	}
	if err := r.add(recordID(7), now.Add(time.Hour), now, false); !errors.Is(err, ErrRefunded) {
		t.Fatalf("a record was forgotten at the cap: %v, want ErrRefunded", err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		_ = r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now, false)
	})
	if allocs != 0 {
		t.Errorf("a refusal at the cap allocates %v times", allocs)
	}
	if err := r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now.Add(time.Second+RefundRecordGrace-time.Nanosecond), false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("add before the first record's grace has passed: %v, want ErrTooManyRefunds", err)
	}
	later := now.Add(time.Second + RefundRecordGrace)
	if err := r.add(recordID(MaxRefundRecords), later.Add(time.Hour), later, false); err != nil {
		t.Fatalf("add once a record expired: %v", err)
	}
	if err := r.add(recordID(0), later.Add(time.Hour), later, false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("second add with one record freed: %v, want ErrTooManyRefunds", err)
	}
}

// BenchmarkRefundRecordsRefusedAtTheCap measures a refused refund on full records, none
// expired: before the expiry heap every refusal swept the whole set.
func BenchmarkRefundRecordsRefusedAtTheCap(b *testing.B) {
	var r refundRecords
	now := time.Unix(1_700_000_000, 0)
	for i := range MaxRefundRecords {
		_ = r.add(recordID(uint64(i)), now.Add(time.Hour), now, false)
	}
	b.ResetTimer()
	for b.Loop() {
		_ = r.add(recordID(MaxRefundRecords), now.Add(time.Hour), now, false)
	}
}
