package v1alpha1

import (
	"errors"
	"iter"
	"strings"
	"testing"
	"time"
)

// databaseZones are names of the tz database, of every shape its names take: one to three
// parts, '_', '-', digits and '+', upper-case letters inside a part, the longest name.
var databaseZones = []string{
	"UTC", "Etc/UTC", "GMT", "GMT0", "EST5EDT", "Etc/GMT+5", "Etc/GMT-14",
	"Europe/Berlin", "America/New_York", "America/Port-au-Prince", "America/Port_of_Spain",
	"America/Argentina/ComodRivadavia", "America/North_Dakota/New_Salem", "America/Santiago",
	"Asia/Kolkata", "Pacific/Apia", "Australia/Lord_Howe", "Antarctica/DumontDUrville",
}

// timeZoneNames yields names for comparing the CRD's pattern with timeZoneForm: the database's,
// every string of up to 4 symbols of an alphabet of the characters that matter (letters, a
// digit, '_', '-', '+', '/', '.', ':', a non-ASCII letter), and "A" followed by each byte.
func timeZoneNames() iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, z := range databaseZones {
			if !yield(z) {
				return
			}
		}
		alphabet := []string{"a", "Z", "5", "_", "-", "+", "/", ".", ":", "é"}
		var gen func(prefix string, n int) bool
		gen = func(prefix string, n int) bool {
			if !yield(prefix) {
				return false
			}
			if n == 0 {
				return true
			}
			for _, c := range alphabet {
				if !gen(prefix+c, n-1) {
					return false
				}
			}
			return true
		}
		if !gen("", 4) {
			return
		}
		for b := range 256 {
			if !yield("A" + string([]byte{byte(b)})) {
				return
			}
		}
	}
}

func TestTimeZoneForm(t *testing.T) {
	for _, z := range databaseZones {
		if !timeZoneForm(z) {
			t.Errorf("timeZoneForm(%q) = false for a name of the tz database", z)
		}
	}
	for _, z := range []string{"", "/", "Europe/", "/Europe/Berlin", "Europe//Berlin", "../etc/passwd", "Europe/..",
		".", "+02:00", "-05", "Etc/-5", "Europe/Berlin ", " UTC", "Europe\\Berlin", "Zürich", "1UTC"} {
		if timeZoneForm(z) {
			t.Errorf("timeZoneForm(%q) = true, want false", z)
		}
	}
}

func TestLoadTimeZone(t *testing.T) {
	for _, z := range databaseZones {
		loc, err := LoadTimeZone(z)
		if err != nil {
			t.Errorf("LoadTimeZone(%q): %v", z, err)
			continue
		}
		if loc.String() != z {
			t.Errorf("LoadTimeZone(%q) = %v", z, loc)
		}
	}
	for _, z := range []string{"", "UTC"} {
		if loc, err := LoadTimeZone(z); err != nil || loc != time.UTC {
			t.Errorf("LoadTimeZone(%q) = %v, %v; want UTC", z, loc, err)
		}
	}
	for _, tt := range []struct {
		name string
		want error
	}{
		{"Local", ErrTimeZoneLocal},
		{"Mars/Olympus_Mons", ErrUnknownTimeZone},
		{"Europe/Atlantis", ErrUnknownTimeZone},
		{"../../etc/passwd", ErrTimeZoneForm},
		{"/etc/localtime", ErrTimeZoneForm},
		{"+02:00", ErrTimeZoneForm},
		{"America/" + strings.Repeat("A", MaxTimeZoneLength-len("America/")+1), ErrTimeZoneForm},
	} {
		loc, err := LoadTimeZone(tt.name)
		if !errors.Is(err, tt.want) || loc != nil {
			t.Errorf("LoadTimeZone(%q) = %v, %v; want %v", tt.name, loc, err, tt.want)
		}
	}
	// The longest name admitted: the form and the length hold, and only the lookup fails.
	if _, err := LoadTimeZone("America/" + strings.Repeat("A", MaxTimeZoneLength-len("America/"))); !errors.Is(err, ErrUnknownTimeZone) {
		t.Errorf("LoadTimeZone of %d characters: %v, want %v", MaxTimeZoneLength, err, ErrUnknownTimeZone)
	}
}
