package helm_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTemplateTLS checks limiterd's serving TLS: the Secret mounted whole (so that its updates
// reach limiterd), the flags, HTTPS probes and scrapes, and the cert-manager Certificate, made
// only when cert-manager is served.
func TestTemplateTLS(t *testing.T) {
	t.Parallel()
	m := render(t, "--set", "limiterd.tls.enabled=true", "--set", "limiterd.tls.clientAuth=true",
		"--set", "metrics.serviceMonitor.enabled=true")
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	c := dep.Spec.Template.Spec.Containers[0]
	for _, arg := range []string{"--tls-cert-file=/etc/limiterd/tls/tls.crt", "--tls-key-file=/etc/limiterd/tls/tls.key",
		"--tls-client-ca-file=/etc/limiterd/tls/ca.crt"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %q lack %s", c.Args, arg)
		}
	}
	if c.LivenessProbe.HTTPGet.Scheme != "HTTPS" || c.ReadinessProbe.HTTPGet.Scheme != "HTTPS" {
		t.Errorf("probe schemes %q %q, want HTTPS", c.LivenessProbe.HTTPGet.Scheme, c.ReadinessProbe.HTTPGet.Scheme)
	}
	var mounted bool
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "tls" {
			mounted = v.Secret != nil && v.Secret.SecretName == limiterdName+"-tls" && len(v.Secret.Items) == 0
		}
	}
	if !mounted {
		t.Errorf("volumes %+v: want Secret %s-tls mounted whole", dep.Spec.Template.Spec.Volumes, limiterdName)
	}
	sm := m.get(t, "ServiceMonitor", limiterdName)
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ep := eps[0].(map[string]any)
	if ep["scheme"] != "https" || ep["tlsConfig"] == nil {
		t.Errorf("ServiceMonitor endpoint %v, want https with a tlsConfig", ep)
	}
	if n := m.kinds()["Certificate"]; n != 0 {
		t.Errorf("%d Certificates without limiterd.tls.certManager.enabled", n)
	}

	certManager := []string{"--set", "limiterd.tls.enabled=true", "--set", "limiterd.tls.certManager.enabled=true",
		"--set", "limiterd.tls.certManager.issuerRef.kind=ClusterIssuer", "--set", "limiterd.tls.certManager.issuerRef.name=internal-ca"}
	if msg := renderErr(t, certManager...); !strings.Contains(msg, "cert-manager.io/v1 is not served") {
		t.Errorf("certManager without cert-manager: %s", msg)
	}
	m = render(t, append(certManager, "--api-versions", "cert-manager.io/v1")...)
	cert := m.get(t, "Certificate", limiterdName)
	if name, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); name != limiterdName+"-tls" {
		t.Errorf("Certificate secretName %q", name)
	}
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	for _, want := range []string{limiterdName + "." + namespace + ".svc", limiterdName + "-admin." + namespace + ".svc"} {
		if !slices.Contains(dns, want) {
			t.Errorf("Certificate dnsNames %q lack %s", dns, want)
		}
	}
	if issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name"); issuer != "internal-ca" {
		t.Errorf("Certificate issuer %q", issuer)
	}
}
