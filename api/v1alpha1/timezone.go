package v1alpha1

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors of LoadTimeZone.
var (
	// ErrTimeZoneForm: the name is longer than MaxTimeZoneLength, or not of the form of a tz
	// database name (the CRD's pattern).
	ErrTimeZoneForm = fmt.Errorf("must be a tz database name of at most %d characters: "+
		"'/'-separated parts of ASCII letters, digits, '_', '-' and '+', each starting with a letter", MaxTimeZoneLength)
	// ErrTimeZoneLocal: the name is "Local", which time.LoadLocation answers with the zone of the
	// host it runs on, so that replicas on hosts of other zones would count other periods.
	ErrTimeZoneLocal = errors.New("must name a zone of the tz database, not Local (a host's own zone)")
	// ErrUnknownTimeZone: the tz database of this binary has no zone of that name.
	ErrUnknownTimeZone = errors.New("unknown time zone: the tz database of this binary has no zone of that name " +
		"(names are case-sensitive, such as \"Europe/Berlin\"; a zone new to the database needs a build that has it)")
)

// LoadTimeZone returns the location a quota's timeZone names; "" is DefaultTimeZone (UTC). It
// refuses, with ErrTimeZoneForm, a name longer than MaxTimeZoneLength or not of the form the
// CRD's pattern admits ('/'-separated parts of ASCII letters, digits, '_', '-' and '+', each
// starting with a letter: no path of the file system can be named), with ErrTimeZoneLocal the
// name "Local", and with ErrUnknownTimeZone a name that time.LoadLocation does not find.
//
// time.LoadLocation reads the system's tz database (/usr/share/zoneinfo, $ZONEINFO) if there is
// one, else the copy a binary embeds by importing time/tzdata, as limiterd and the operator do
// so that their scratch images know every zone. Two binaries built with different copies may
// disagree on a zone added to the database recently: the one that does not know it refuses the
// policy (Validate), and the policy's last good version keeps serving.
func LoadTimeZone(name string) (*time.Location, error) {
	switch {
	case name == "":
		name = DefaultTimeZone
	case len(name) > MaxTimeZoneLength || !timeZoneForm(name):
		return nil, ErrTimeZoneForm
	case name == "Local":
		return nil, ErrTimeZoneLocal
	}
	loc, err := time.LoadLocation(name)
	switch {
	case err == nil:
		return loc, nil
	case strings.HasPrefix(err.Error(), "unknown time zone"): // time.LoadLocation's "unknown time zone <name>"
		return nil, ErrUnknownTimeZone
	}
	return nil, fmt.Errorf("%w: %w", ErrUnknownTimeZone, err) // a database file it could not read
}

// timeZoneForm reports whether name has the form of a tz database name, as the CRD's pattern
// ^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z][A-Za-z0-9_+-]*)*$ says: '/'-separated parts, each a letter
// followed by letters, digits, '_', '-' and '+'. Every name of the database has that form
// ("America/Argentina/ComodRivadavia", "Etc/GMT+5", "EST5EDT"); no part is "." or "..", and
// none starts with '/'.
func timeZoneForm(name string) bool {
	partStart := true
	for i := range len(name) {
		c := name[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9', c == '_', c == '-', c == '+':
			if partStart {
				return false
			}
		case c == '/':
			if partStart {
				return false // an empty part, or a leading '/'
			}
			partStart = true
			continue
		default:
			return false
		}
		partStart = false
	}
	return !partStart // not empty, and no trailing '/'
}
