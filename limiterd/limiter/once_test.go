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
		err := r.add(id, uint64(id[15]%7), until, now, false)
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
		held := 0
		for _, n := range r.held {
			held += int(n)
		}
		if held != len(model) {
			t.Fatalf("step %d: the clients' counts add up to %d records, want %d", step, held, len(model))
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
		if err := r.add(recordID(uint64(i)), uint64(i), until, now, false); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if err := r.add(recordID(MaxRefundRecords), MaxRefundRecords, now.Add(time.Hour), now, false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("add past the cap: %v, want ErrTooManyRefunds", err)
	}
	if err := r.add(recordID(7), 7, now.Add(time.Hour), now, false); !errors.Is(err, ErrRefunded) {
		t.Fatalf("a record was forgotten at the cap: %v, want ErrRefunded", err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		_ = r.add(recordID(MaxRefundRecords), MaxRefundRecords, now.Add(time.Hour), now, false)
	})
	if allocs != 0 {
		t.Errorf("a refusal at the cap allocates %v times", allocs)
	}
	if err := r.add(recordID(MaxRefundRecords), MaxRefundRecords, now.Add(time.Hour), now.Add(time.Second+RefundRecordGrace-time.Nanosecond), false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("add before the first record's grace has passed: %v, want ErrTooManyRefunds", err)
	}
	later := now.Add(time.Second + RefundRecordGrace)
	if err := r.add(recordID(MaxRefundRecords), MaxRefundRecords, later.Add(time.Hour), later, false); err != nil {
		t.Fatalf("add once a record expired: %v", err)
	}
	if err := r.add(recordID(0), 0, later.Add(time.Hour), later, false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("second add with one record freed: %v, want ErrTooManyRefunds", err)
	}
}

// BenchmarkRefundRecordsRefusedAtTheCap measures a refused refund on full records, none
// expired: before the expiry heap every refusal swept the whole set.
func BenchmarkRefundRecordsRefusedAtTheCap(b *testing.B) {
	var r refundRecords
	now := time.Unix(1_700_000_000, 0)
	for i := range MaxRefundRecords {
		_ = r.add(recordID(uint64(i)), uint64(i), now.Add(time.Hour), now, false)
	}
	b.ResetTimer()
	for b.Loop() {
		_ = r.add(recordID(MaxRefundRecords), MaxRefundRecords, now.Add(time.Hour), now, false)
	}
}

// TestRefundRecordsShareFairly: one client's records stop at half of MaxRefundRecords, refusing
// its refund past them without forgetting one (its recorded IDs still answer ErrRefunded),
// while another client's refund is recorded; a second flooding client stops at a third; a
// client holding fewer records than are free still has its refunds recorded; a client's records
// are taken again as its own expire (issue 34: one client filled the store's records and every
// client's refunds were refused).
func TestRefundRecordsShareFairly(t *testing.T) {
	var r refundRecords
	now := time.Unix(1_700_000_000, 0)
	var next uint64
	// fill adds records of client until one is refused, and returns how many it added.
	fill := func(client uint64, until time.Time) int {
		n := 0
		for ; ; n++ {
			err := r.add(recordID(next), client, until, now, false)
			if errors.Is(err, ErrTooManyRefunds) {
				return n
			} else if err != nil {
				t.Fatalf("client %d, record %d: %v", client, n, err)
			}
			next++
		}
	}
	const flood, flood2, other = 1, 2, 3
	if err := r.add(recordID(next), flood, now.Add(time.Second), now, false); err != nil {
		t.Fatal(err)
	}
	next++
	if got := 1 + fill(flood, now.Add(time.Hour)); got != MaxRefundRecords/2 {
		t.Fatalf("one client alone took %d records, want half of %d", got, MaxRefundRecords)
	}
	for _, i := range []uint64{0, 1, next - 1} {
		if err := r.add(recordID(i), flood, now.Add(time.Hour), now, false); !errors.Is(err, ErrRefunded) {
			t.Fatalf("record %d forgotten at the client's share: %v, want ErrRefunded", i, err)
		}
	}
	if err := r.add(recordID(1<<40), other, now.Add(time.Hour), now, false); err != nil {
		t.Fatalf("another client's refund after one client's flood: %v", err)
	}
	if got := fill(flood2, now.Add(time.Hour)); got > MaxRefundRecords/3 {
		t.Fatalf("a second flooding client took %d records, over a third of %d", got, MaxRefundRecords)
	}
	free := MaxRefundRecords - r.len()
	for i := range free / 2 {
		if err := r.add(recordID(1<<41+uint64(i)), other, now.Add(time.Hour), now, false); err != nil {
			t.Fatalf("refund %d of a client holding fewer records than the %d free: %v", i, free, err)
		}
	}
	if err := r.add(recordID(1<<42), flood, now.Add(time.Hour), now, false); !errors.Is(err, ErrTooManyRefunds) {
		t.Fatalf("the flooding client's refund past its share: %v, want ErrTooManyRefunds", err)
	}
	later := now.Add(time.Second + RefundRecordGrace)
	r.sweep(later)
	now = later
	if got := fill(flood, now.Add(time.Hour)); got != 0 {
		// Its share shrank as others took records: one expired record gives it none back.
		t.Logf("after one of its records expired, the flooding client took %d", got)
	}
	r.sweep(now.Add(3 * time.Hour))
	if r.len() != 0 || r.held != nil {
		t.Fatalf("after every record expired: %d records, %d counts", r.len(), len(r.held))
	}
}
