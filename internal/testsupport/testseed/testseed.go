// Package testseed gives the module's randomized tests (models, property tests) their seed. By
// default every test draws a new one, so that each run explores new sequences; the seed is logged,
// and on failure the test says how to replay it: go test -run <the test> <package> -args -seed N.
//
// It is a package of its own, without dependencies, so that the internal tests of
// limiterd/limiter (which internal/testsupport depends on) can use it too. Import it only from
// _test.go files: it registers the -seed flag.
package testseed

import (
	"flag"
	"math/rand/v2"
	"testing"
)

var seedFlag = flag.Uint64("seed", 0, "seed of the randomized tests (0: a random one for each test); a failing test prints the one to replay")

// Seed returns the test's seed: the -seed flag when set, otherwise one drawn at random. It logs
// the seed, and, if t fails, the command that replays it. A test that runs n sequences runs them
// from Seed(t), Seed(t)+1, …, Seed(t)+n-1, so that one -seed replays them all.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = rand.Uint64() | 1 // never 0, which would read as "draw one"
	}
	t.Logf("seed %d (replay with -args -seed %d)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed with seed %d: replay with go test -run '^%s$' <package> -args -seed %d", seed, t.Name(), seed)
		}
	})
	return seed
}

// Rand returns a generator of the sequence numbered stream of the test's seed (see Seed).
func Rand(t testing.TB, stream uint64) *rand.Rand {
	t.Helper()
	return rand.New(rand.NewPCG(Seed(t), stream))
}
