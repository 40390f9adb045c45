package v1alpha1

import (
	"encoding/json"
	"errors"
	"iter"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	schemacel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
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

// timeZoneLookupRule is the CRD's CEL rule that looks a quota's timeZone up in the API server's
// tz database: converting a time into an unknown zone is an evaluation error, which the API
// server reports as the field's Invalid value, with time.LoadLocation's "unknown time zone <name>".
// The server does not ratchet an evaluation error as it does a false result, so the rule admits
// an unchanged stored name itself (optionalOldSelf: it also runs on create, without oldSelf).
const timeZoneLookupRule = "(oldSelf.hasValue() && oldSelf.value() == self) || timestamp('2000-01-01T00:00:00Z').getHours(self) >= 0"

// TestCRDTimeZoneRulesMatchLoadTimeZone runs the CEL rules of the CRD's timeZone through the API
// server's own validator (apiextensions-apiserver, as kube-apiserver runs them) and checks that,
// with the same tz database, they refuse exactly the names of the right form that LoadTimeZone
// refuses, the zone's name in the message of an unknown one: the API server and Validate (the
// operator's and limiterd's check) agree but for the databases they are given.
func TestCRDTimeZoneRulesMatchLoadTimeZone(t *testing.T) {
	for _, n := range []schemaNode{loadCRDSchema(t).prop("spec", "tiers", "[]", "quota", "timeZone"),
		loadCRDSchema(t).prop("spec", "tiers", "[]", "limits", "[]", "quota", "timeZone")} {
		v := timeZoneValidator(t, n)
		names := slices.Collect(timeZoneNames())
		names = append(names, "Local", "Mars/Olympus_Mons", "Europe/Atlantis", "europe/berlin", "US/Pacific-New",
			"America/"+strings.Repeat("A", MaxTimeZoneLength-len("America/")))
		admitted, refused := 0, 0
		for _, name := range names {
			if len(name) > MaxTimeZoneLength || !timeZoneForm(name) {
				continue // refused by the CRD's pattern and maxLength, and by LoadTimeZone (TestTimeZoneForm)
			}
			errs, _ := v.Validate(t.Context(), field.NewPath("timeZone"), nil, name, nil, celconfig.RuntimeCELCostBudget)
			_, goErr := LoadTimeZone(name)
			if goErr == nil {
				admitted++
			} else {
				refused++
			}
			switch {
			case goErr == nil && len(errs) > 0:
				t.Errorf("%q: the CRD refuses it (%v), LoadTimeZone admits it", name, errs)
			case goErr != nil && len(errs) == 0:
				t.Errorf("%q: the CRD admits it, LoadTimeZone refuses it: %v", name, goErr)
			case errors.Is(goErr, ErrUnknownTimeZone) && !strings.Contains(errs.ToAggregate().Error(), "unknown time zone "+name):
				t.Errorf("%q: the CRD refuses it with %v, want the message to name it", name, errs)
			}
		}
		if admitted < len(databaseZones) || refused < 100 {
			t.Errorf("%d names of the right form admitted and %d refused by LoadTimeZone: too few to compare", admitted, refused)
		}
	}
}

// timeZoneValidator returns the API server's validator of the CEL rules of a CRD schema node
// (a timeZone).
func timeZoneValidator(t *testing.T, n schemaNode) *schemacel.Validator {
	t.Helper()
	v := schemacel.NewValidator(structuralSchema(t, n), false, celconfig.PerCallLimit)
	if v == nil {
		t.Fatal("the CRD's timeZone has no CEL rule")
	}
	return v
}

// structuralSchema returns a CRD schema node in the API server's own form, from which its
// validators are built.
func structuralSchema(t *testing.T, n schemaNode) *structuralschema.Structural {
	t.Helper()
	internal := internalSchema(t, n)
	s, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// internalSchema returns a CRD schema node as the API server's internal JSONSchemaProps.
func internalSchema(t *testing.T, n schemaNode) *apiextensions.JSONSchemaProps {
	t.Helper()
	j, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	var props apiextensionsv1.JSONSchemaProps
	if err := json.Unmarshal(j, &props); err != nil {
		t.Fatal(err)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(&props, &internal, nil); err != nil {
		t.Fatal(err)
	}
	return &internal
}
