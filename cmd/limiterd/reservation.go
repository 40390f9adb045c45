package main

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/limiterd/limiterd/limiterd/reservation"
)

// reservationConfig is the key that signs the reservations of refunds.
type reservationConfig struct {
	keyFile string
}

func (c *reservationConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.keyFile, "reservation-key-file", "",
		"`path` of the key that signs refund reservations: at least 32 random bytes (surrounding whitespace ignored), the same "+
			"file for every replica of a shared store; read at start. The memory store always signs with a key of its own process "+
			"(its state is per process: a reservation refunds only on the replica that charged it); with --store redis and "+
			"no key file refunds are unavailable (every refund is refused, no reservation is answered)")
}

// engineOptions returns the engine's reservation options for a store kind: the signer (nil:
// the engine's own random key) and, when refunds are unavailable, why.
func (c *reservationConfig) engineOptions(storeKind string, log *slog.Logger) (*reservation.Signer, string, error) {
	if c.keyFile == "" {
		if storeKind == "redis" {
			const why = "--store redis needs --reservation-key-file: the replicas must share the key that signs reservations"
			log.Warn("refunds unavailable: every refund is refused", "reason", why)
			return nil, why, nil
		}
		return nil, "", nil
	}
	raw, err := os.ReadFile(c.keyFile)
	if err != nil {
		return nil, "", fmt.Errorf("read --reservation-key-file: %w", err)
	}
	s, err := reservation.NewSigner(bytes.TrimSpace(raw))
	if err != nil {
		return nil, "", fmt.Errorf("--reservation-key-file %s: %w", c.keyFile, err)
	}
	if storeKind != "redis" {
		// Each replica's memory is its own: a reservation must refund only the replica that
		// charged it, or one reservation would refund once on every replica.
		log.Info("memory store: refund reservations are signed with a key of this process, not --reservation-key-file")
		return nil, "", nil
	}
	return s, "", nil
}
