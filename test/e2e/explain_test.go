package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestKubectlExplainQuota: `kubectl explain` documents a calendar quota's fields from the
// installed CRD, as a user reads them before writing a policy (issue 37's "kubectl explain
// knows Quota").
func TestKubectlExplainQuota(t *testing.T) {
	env := testenv.Shared(t)
	var out string
	// kubectl's discovery learns the CRD a moment after the shared control plane installs it.
	testsupport.Eventually(t, waitTimeout, "kubectl explain served", func() error {
		o, errOut, err := kubectl(env, "", "explain", "ratelimitpolicies.spec.tiers.quota")
		if err != nil {
			return fmt.Errorf("%w: %s", err, errOut)
		}
		out = o
		return nil
	})
	for _, want := range []string{"limit", "period", "timeZone", "Day", "Week", "Month", "Year", "IANA", "UTC"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl explain ratelimitpolicies.spec.tiers.quota lacks %q:\n%s", want, out)
		}
	}
	out = mustKubectl(t, env, "", "explain", "ratelimitpolicies.spec.tiers.algorithm")
	if !strings.Contains(out, "Quota") {
		t.Errorf("kubectl explain ratelimitpolicies.spec.tiers.algorithm does not name Quota:\n%s", out)
	}
}
