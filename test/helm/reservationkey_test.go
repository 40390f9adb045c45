package helm_test

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestTemplateReservationKey checks the key that signs refund reservations: by default a Secret
// the chart creates (kept on uninstall) holding 64 random characters, mounted and passed to
// every replica; with existingSecret, that Secret's key and no Secret of the chart's.
func TestTemplateReservationKey(t *testing.T) {
	t.Parallel()
	m := render(t)
	secret := typed[corev1.Secret](t, m.get(t, "Secret", limiterdName+"-reservation-key"))
	if len(secret.Data["key"]) != 64 || secret.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("reservation key Secret %+v: want a 64-byte key, kept", secret.ObjectMeta)
	}
	check := func(dep *appsv1.Deployment, secretName, key string) {
		t.Helper()
		c := dep.Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--reservation-key-file=/etc/limiterd/reservation-key/key") {
			t.Errorf("args %q lack --reservation-key-file", c.Args)
		}
		var ok bool
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == "reservation-key" {
				ok = v.Secret != nil && v.Secret.SecretName == secretName && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == key
			}
		}
		if !ok {
			t.Errorf("volumes %+v: want Secret %s (key %s) as reservation-key", dep.Spec.Template.Spec.Volumes, secretName, key)
		}
	}
	check(typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName)), limiterdName+"-reservation-key", "key")

	m = render(t, "--set", "limiterd.reservationKey.existingSecret=mine", "--set", "limiterd.reservationKey.secretKey=k")
	if n := m.kinds()["Secret"]; n != 0 {
		t.Errorf("%d Secrets with an existing reservation key Secret", n)
	}
	check(typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName)), "mine", "k")
}
