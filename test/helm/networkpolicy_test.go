package helm_test

import (
	"reflect"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ingressRule is what one port of a NetworkPolicy admits: open (a rule without peers: every
// source), or the peers listed.
type ingressRule struct {
	open  bool
	peers []networkingv1.NetworkPolicyPeer
}

// ingressByPort maps each named port of a NetworkPolicy's ingress rules to what it admits. A
// rule without ports (every port) fails t: the chart names every port it opens.
func ingressByPort(t testing.TB, np *networkingv1.NetworkPolicy) map[string]ingressRule {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("NetworkPolicy %s: policyTypes %v, want [Ingress]", np.Name, np.Spec.PolicyTypes)
	}
	out := map[string]ingressRule{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("NetworkPolicy %s has a rule open to every port: %+v", np.Name, r)
		}
		for _, p := range r.Ports {
			if p.Port == nil || p.Protocol == nil || *p.Protocol != "TCP" {
				t.Errorf("NetworkPolicy %s: port %+v, want a named TCP port", np.Name, p)
				continue
			}
			cur := out[p.Port.String()]
			cur.open = cur.open || len(r.From) == 0
			cur.peers = append(cur.peers, r.From...)
			out[p.Port.String()] = cur
		}
	}
	return out
}

// namespacesNamed returns the namespace names a peer selects by kubernetes.io/metadata.name In
// (...), and whether the peer is exactly that: no pod selector, no IP block, no other term.
func namespacesNamed(p networkingv1.NetworkPolicyPeer) ([]string, bool) {
	s := p.NamespaceSelector
	if s == nil || p.PodSelector != nil || p.IPBlock != nil || len(s.MatchLabels) != 0 || len(s.MatchExpressions) != 1 {
		return nil, false
	}
	e := s.MatchExpressions[0]
	if e.Key != "kubernetes.io/metadata.name" || e.Operator != metav1.LabelSelectorOpIn {
		return nil, false
	}
	return e.Values, true
}

// checkOnlyNamespaces fails t unless a port admits exactly the pods of the namespaces named.
func checkOnlyNamespaces(t testing.TB, what string, r ingressRule, names ...string) {
	t.Helper()
	if r.open || len(r.peers) != 1 {
		t.Errorf("%s admits %+v (open %v), want the namespaces %v by name only", what, r.peers, r.open, names)
		return
	}
	got, ok := namespacesNamed(r.peers[0])
	if !ok || !slices.Equal(got, names) {
		t.Errorf("%s admits %+v, want the namespaces %v by name only", what, r.peers[0], names)
	}
}

// everyPod reports whether peers is exactly "every pod of every namespace".
func everyPod(r ingressRule) bool {
	if r.open || len(r.peers) != 1 {
		return false
	}
	p := r.peers[0]
	return p.PodSelector == nil && p.IPBlock == nil && p.NamespaceSelector != nil &&
		len(p.NamespaceSelector.MatchLabels) == 0 && len(p.NamespaceSelector.MatchExpressions) == 0
}

// TestTemplateNetworkPolicy checks the NetworkPolicies, which are on by default: limiterd's
// decisions port admits every pod (and configured peers), its admin port only pods of the
// namespaces named, the operator's metrics port only pods of the monitoring namespaces; no rule
// opens a port that is not named. They are checked as rendered: enforcing them needs a network
// plugin that implements NetworkPolicy, which the test API server has not.
func TestTemplateNetworkPolicy(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		m := render(t)
		np := typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", limiterdName))
		ports := ingressByPort(t, np)
		if !everyPod(ports["http"]) {
			t.Errorf("decisions port admits %+v (open %v), want every pod of every namespace only", ports["http"].peers, ports["http"].open)
		}
		checkOnlyNamespaces(t, "admin port", ports["admin"], "monitoring")
		if len(ports) != 2 {
			t.Errorf("limiterd NetworkPolicy opens ports %v, want http and admin", keys(ports))
		}
		onp := typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", operatorName))
		oports := ingressByPort(t, onp)
		checkOnlyNamespaces(t, "operator metrics port", oports["metrics"], "monitoring")
		if len(oports) != 1 {
			t.Errorf("operator NetworkPolicy opens ports %v, want metrics", keys(oports))
		}
		// The probes port is not opened to any pod: the kubelet's probes come from the node.
		if _, ok := oports["probes"]; ok {
			t.Errorf("operator NetworkPolicy opens the probes port")
		}
	})

	t.Run("every feature", func(t *testing.T) {
		t.Parallel()
		m := render(t, "--values", chartRel+"/ci/all-features-values.yaml")
		np := typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", limiterdName))
		ports := ingressByPort(t, np)
		http := ports["http"]
		if http.open || len(http.peers) != 3 ||
			http.peers[0].NamespaceSelector == nil || http.peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "shop" ||
			http.peers[1].NamespaceSelector == nil || len(http.peers[1].NamespaceSelector.MatchExpressions) != 1 ||
			http.peers[1].PodSelector == nil || http.peers[1].PodSelector.MatchLabels["app"] != "checkout" ||
			http.peers[2].IPBlock == nil || http.peers[2].IPBlock.CIDR != "10.0.0.0/8" || !slices.Equal(http.peers[2].IPBlock.Except, []string{"10.1.0.0/16"}) {
			t.Errorf("decisions port admits %+v, want the peers of networkPolicy.decisions.from", http.peers)
		}
		if !reflect.DeepEqual(ports["grpc"], http) {
			t.Errorf("gRPC port admits %+v, differing from the decisions port's %+v", ports["grpc"], http)
		}
		checkOnlyNamespaces(t, "admin port", ports["admin"], "monitoring", "platform-ops")
		if len(ports) != 3 {
			t.Errorf("limiterd NetworkPolicy opens ports %v, want http, grpc and admin", keys(ports))
		}
		checkOnlyNamespaces(t, "operator metrics port",
			ingressByPort(t, typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", operatorName)))["metrics"], "monitoring")
	})

	t.Run("no namespace named: nobody reaches admin or metrics", func(t *testing.T) {
		t.Parallel()
		m := render(t, "--set-json", "networkPolicy.admin.namespaces=[]", "--set-json", "networkPolicy.operatorMetrics.namespaces=[]")
		np := typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", limiterdName))
		if ports := ingressByPort(t, np); len(ports) != 1 || !everyPod(ports["http"]) {
			t.Errorf("limiterd NetworkPolicy admits %+v, want the decisions port alone", ports)
		}
		onp := typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", operatorName))
		// An empty list of rules with policyTypes Ingress denies every ingress.
		if onp.Spec.Ingress == nil || len(onp.Spec.Ingress) != 0 {
			t.Errorf("operator NetworkPolicy ingress %+v, want an empty list (deny all)", onp.Spec.Ingress)
		}
		ingressByPort(t, onp) // checks policyTypes
	})

	t.Run("empty decisions peers admit every source", func(t *testing.T) {
		t.Parallel()
		m := render(t, "--set-json", "networkPolicy.decisions.from=[]", "--set", "limiterd.service.type=LoadBalancer")
		ports := ingressByPort(t, typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", limiterdName)))
		if !ports["http"].open || len(ports["http"].peers) != 0 {
			t.Errorf("decisions port admits %+v, want every source (a rule without peers)", ports["http"])
		}
		checkOnlyNamespaces(t, "admin port", ports["admin"], "monitoring") // unchanged
	})

	t.Run("off", func(t *testing.T) {
		t.Parallel()
		if n := len(render(t, "--set", "networkPolicy.enabled=false").ofKind("NetworkPolicy")); n != 0 {
			t.Errorf("networkPolicy.enabled=false: %d NetworkPolicies rendered", n)
		}
	})

	t.Run("without the operator, limiterd's alone", func(t *testing.T) {
		t.Parallel()
		m := render(t, "--set", "operator.enabled=false")
		if nps := m.ofKind("NetworkPolicy"); len(nps) != 1 || nps[0].GetName() != limiterdName {
			t.Errorf("operator.enabled=false: NetworkPolicies %v, want limiterd's alone", nps)
		}
	})
}
