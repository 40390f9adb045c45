package helm_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTemplateAllowedHosts: limiterd answers requests to its decisions Service's DNS names
// (--allowed-hosts): <fullname>, <fullname>.<namespace>, <fullname>.<namespace>.svc and
// <fullname>.<namespace>.svc.<clusterDomain>, whatever the Service is called, then
// limiterd.extraAllowedHosts; any other Host but an IP address answers 421. The cert-manager
// Certificate names the same Service names, in the same cluster domain.
func TestTemplateAllowedHosts(t *testing.T) {
	t.Parallel()
	serviceNames := func(svc, domain string) []string {
		return []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc", svc + "." + namespace + ".svc." + domain}
	}
	certManager := []string{"--set", "limiterd.tls.enabled=true", "--set", "limiterd.tls.certManager.enabled=true",
		"--set", "limiterd.tls.certManager.issuerRef.name=internal-ca", "--api-versions", "cert-manager.io/v1"}
	for _, tc := range []struct {
		name   string
		args   []string
		svc    string
		domain string
		extra  []string
	}{
		{"defaults", certManager, limiterdName, "cluster.local", nil},
		{"another name, cluster domain and extra names",
			append([]string{"--set", "fullnameOverride=ratelimit", "--set", "clusterDomain=corp.example",
				"--set-json", `limiterd.extraAllowedHosts=["ratelimit.example.com","Gateway-Limits"]`}, certManager...),
			"ratelimit", "corp.example", []string{"ratelimit.example.com", "Gateway-Limits"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := render(t, tc.args...)
			m.get(t, "Service", tc.svc) // the decisions Service is the one the names name
			c := container(t, typed[appsv1.Deployment](t, m.get(t, "Deployment", tc.svc)), "limiterd")
			want := append(serviceNames(tc.svc, tc.domain), tc.extra...)
			if v, ok := flagValue(c.Args, "--allowed-hosts"); !ok || !slices.Equal(strings.Split(v, ","), want) {
				t.Errorf("--allowed-hosts=%s (given: %t), want %s", v, ok, strings.Join(want, ","))
			}
			dns, _, _ := unstructured.NestedStringSlice(m.get(t, "Certificate", tc.svc).Object, "spec", "dnsNames")
			if want := append(serviceNames(tc.svc, tc.domain), serviceNames(tc.svc+"-admin", tc.domain)...); !slices.Equal(dns, want) {
				t.Errorf("Certificate dnsNames %q, want %q", dns, want)
			}
		})
	}
}
