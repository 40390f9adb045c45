package controllers

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
)

// TestAdmissionMatchesValidate runs the policy files of api/v1alpha1/testdata against both the
// API server (the CRD's schema and CEL rules, by a dry-run create) and the Go validator
// (DecodePolicies): both must accept every valid file and reject every invalid one, naming the
// field its "# field:" (or "# apiserver-field:") line gives; except that the API server admits
// an invalid file marked "# apiserver-accepts:" (a rule the CRD cannot express), which only the
// Go validator refuses.
func TestAdmissionMatchesValidate(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	for _, dir := range []string{"valid", "invalid"} {
		for _, f := range loadPolicyFiles(t, dir) {
			t.Run(dir+"/"+f.Name, func(t *testing.T) {
				_, goErr := limiterdv1alpha1.DecodePolicies(f.Data)

				j, err := yaml.YAMLToJSON(f.Data)
				if err != nil {
					t.Fatal(err)
				}
				obj := &unstructured.Unstructured{}
				if err := obj.UnmarshalJSON(j); err != nil {
					t.Fatal(err)
				}
				obj.SetNamespace(ns)
				apiErr := env.Client.Create(t.Context(), obj, client.DryRunAll)

				if dir == "valid" {
					if goErr != nil {
						t.Errorf("Go validator rejected a valid policy: %v", goErr)
					}
					if apiErr != nil {
						t.Errorf("API server rejected a valid policy: %v", apiErr)
					}
					return
				}
				if goErr == nil || !strings.Contains(goErr.Error(), f.Field) {
					t.Errorf("Go validator: got error %v, want one naming %s", goErr, f.Field)
				}
				if f.APIServerAccepts != "" {
					if apiErr != nil {
						t.Errorf("API server rejected a policy marked as admitted (%s): %v; remove the apiserver-accepts line", f.APIServerAccepts, apiErr)
					}
					return
				}
				if !apierrors.IsInvalid(apiErr) || !strings.Contains(apiErr.Error(), f.APIServerField) {
					t.Errorf("API server: got error %v, want Invalid naming %s", apiErr, f.APIServerField)
				}
			})
		}
	}
}

// TestAPIServerRefusesUnknownTimeZone: the API server looks a quota's timeZone up in its own tz
// database (a CEL rule converts a time into the zone) and refuses a well-formed name of no zone,
// on a tier's quota and on a stacked limit's, with the zone's name in the message; a zone it
// knows is admitted. Before the rule, the CRD checked the name's form only, and such a policy got
// as far as the operator.
func TestAPIServerRefusesUnknownTimeZone(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	tierQuota := func(p *limiterdv1alpha1.RateLimitPolicy, zone string) {
		p.Spec.Tiers[0] = limiterdv1alpha1.Tier{Name: "free", Algorithm: limiterdv1alpha1.AlgorithmQuota,
			Quota: &limiterdv1alpha1.Quota{Limit: 1000, Period: limiterdv1alpha1.CalendarPeriodMonth, TimeZone: zone}}
	}
	limitQuota := func(p *limiterdv1alpha1.RateLimitPolicy, zone string) {
		p.Spec.Tiers[0] = limiterdv1alpha1.Tier{Name: "free", Limits: []limiterdv1alpha1.Limit{{
			Name: "monthly", Algorithm: limiterdv1alpha1.AlgorithmQuota,
			Quota: &limiterdv1alpha1.Quota{Limit: 1000, Period: limiterdv1alpha1.CalendarPeriodMonth, TimeZone: zone}}}}
	}
	for _, tt := range []struct {
		name  string
		set   func(*limiterdv1alpha1.RateLimitPolicy, string)
		field string
	}{
		{"tier", tierQuota, "spec.tiers[0].quota.timeZone"},
		{"limit", limitQuota, "spec.tiers[0].limits[0].quota.timeZone"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The API server's message reads: spec.tiers[0].quota.timeZone: Invalid value:
			// "string": unknown time zone Mars/Olympus_Mons evaluating rule: must name a zone of
			// the API server's tz database (...).
			for _, zone := range []string{"Mars/Olympus_Mons", "Europe/Atlantis", "europe/berlin"} {
				p := newPolicy(ns, "zone-unknown-"+tt.name)
				tt.set(p, zone)
				err := env.Client.Create(t.Context(), p)
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.field) ||
					!strings.Contains(err.Error(), "unknown time zone "+zone) {
					t.Errorf("create with timeZone %q: %v, want Invalid naming %s and %q", zone, err, tt.field, "unknown time zone "+zone)
				}
			}
			for _, zone := range []string{"America/New_York", "America/Argentina/Buenos_Aires", "Etc/GMT-3", "UTC"} {
				p := newPolicy(ns, "zone-known-"+strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(zone))+"-"+tt.name)
				tt.set(p, zone)
				if err := env.Client.Create(t.Context(), p); err != nil {
					t.Errorf("create with timeZone %q: %v, want it admitted", zone, err)
				}
			}
		})
	}
}

// TestStoredUnknownTimeZoneStaysWritable: a policy stored with a zone the API server does not
// know (written before the CRD had the rule, or when the server's tz database had the zone) can
// still be updated as long as the zone stays as it is: its metadata, its other fields, its status
// (which the operator writes, Ready=False reason Invalid). The API server runs the CRD's rules on
// every update, status included, and does not ratchet a rule's evaluation error as it does a
// false result; without the rule's own "unchanged" case the object could not be relabelled, have
// its finalizers removed, or be reported on. A changed zone is looked up again.
func TestStoredUnknownTimeZoneStaysWritable(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	p := newPolicy(ns, "zone-stored")
	p.Spec.Tiers[0] = limiterdv1alpha1.Tier{Name: "free", Limits: []limiterdv1alpha1.Limit{{
		Name: "monthly", Algorithm: limiterdv1alpha1.AlgorithmQuota,
		Quota: &limiterdv1alpha1.Quota{Limit: 1000, Period: limiterdv1alpha1.CalendarPeriodMonth, TimeZone: "Mars/Olympus_Mons"}}}}
	p.Spec.Tiers = append(p.Spec.Tiers, limiterdv1alpha1.Tier{Name: "metered", Algorithm: limiterdv1alpha1.AlgorithmQuota,
		Quota: &limiterdv1alpha1.Quota{Limit: 10, Period: limiterdv1alpha1.CalendarPeriodDay, TimeZone: "Europe/Atlantis"}})
	t.Run("stored while the CRD did not look zones up", func(t *testing.T) {
		loosenCRD(t, env)
		if err := env.Client.Create(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}) // the CRD is restored
	key := client.ObjectKeyFromObject(p)

	p = edit(t, env.Client, key, func(p *limiterdv1alpha1.RateLimitPolicy) {
		p.Labels = map[string]string{"team": "billing"}
		p.Spec.Tiers[2].Quota.Limit = 20 // beside the zone, in the same quota
	})
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse,
		Reason: "Invalid", Message: "unknown time zone", ObservedGeneration: p.Generation})
	if err := env.Client.Status().Update(t.Context(), p); err != nil {
		t.Errorf("status update of a policy whose stored zone is unknown: %v, want it admitted", err)
	}

	for _, tt := range []struct {
		name   string
		change func(*limiterdv1alpha1.RateLimitPolicy)
		field  string
		zone   string
	}{
		{"limit", func(p *limiterdv1alpha1.RateLimitPolicy) {
			p.Spec.Tiers[0].Limits[0].Quota.TimeZone = "Europe/Atlantis"
		},
			"spec.tiers[0].limits[0].quota.timeZone", "Europe/Atlantis"},
		{"tier", func(p *limiterdv1alpha1.RateLimitPolicy) { p.Spec.Tiers[2].Quota.TimeZone = "Mars/Olympus_Mons" },
			"spec.tiers[2].quota.timeZone", "Mars/Olympus_Mons"},
	} {
		q := &limiterdv1alpha1.RateLimitPolicy{}
		if err := env.Client.Get(t.Context(), key, q); err != nil {
			t.Fatal(err)
		}
		tt.change(q)
		err := env.Client.Update(t.Context(), q)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.field) || !strings.Contains(err.Error(), "unknown time zone "+tt.zone) {
			t.Errorf("%s: update to another unknown zone: %v, want Invalid naming %s and %s", tt.name, err, tt.field, tt.zone)
		}
	}
	edit(t, env.Client, key, func(p *limiterdv1alpha1.RateLimitPolicy) {
		p.Spec.Tiers[0].Limits[0].Quota.TimeZone = "America/New_York"
		p.Spec.Tiers[2].Quota.TimeZone = "Europe/Berlin"
	})
}
