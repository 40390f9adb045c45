package helm_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSchemaRefusesBadValues checks that values.schema.json refuses wrong types, unknown keys and
// bad enumerations, and that helm's error names the offending key.
func TestSchemaRefusesBadValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want []string // each must appear in helm's error output
	}{
		{"wrong type: string for an integer", []string{"--set", "limiterd.replicaCount=two"},
			[]string{"/limiterd/replicaCount", "want integer"}},
		{"wrong type: string for a boolean", []string{"--set-string", "operator.leaderElection.enabled=yes"},
			[]string{"/operator/leaderElection/enabled", "want boolean"}},
		{"wrong type: string for a list", []string{"--set", "limiterd.store.redis.addrs=redis:6379"},
			[]string{"/limiterd/store/redis/addrs", "want array"}},
		{"wrong type: object for a string", []string{"--set", "limiterd.store.redis.tls.serverName.host=redis"},
			[]string{"/limiterd/store/redis/tls/serverName", "want string"}},
		{"address without a port", []string{"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.addrs={redis}"},
			[]string{"/limiterd/store/redis/addrs/0"}},
		{"unknown top-level key", []string{"--set", "replicas=3"},
			[]string{"additional properties 'replicas' not allowed"}},
		{"unknown nested key", []string{"--set", "limiterd.store.redis.passwrd=x"},
			[]string{"/limiterd/store/redis", "additional properties 'passwrd' not allowed"}},
		{"unknown key in a probe", []string{"--set", "operator.livenessProbe.path=/x"},
			[]string{"/operator/livenessProbe", "additional properties 'path' not allowed"}},
		{"unknown key in a security context", []string{"--set", "limiterd.securityContext.runAsRoot=true"},
			[]string{"/limiterd/securityContext", "additional properties 'runAsRoot' not allowed"}},
		{"store type not in the enumeration", []string{"--set", "limiterd.store.type=etcd"},
			[]string{"/limiterd/store/type", "must be one of"}},
		{"service type not in the enumeration", []string{"--set", "limiterd.service.type=External"},
			[]string{"/limiterd/service/type"}},
		{"port out of range", []string{"--set", "limiterd.ports.admin=70000"},
			[]string{"/limiterd/ports/admin", "maximum"}},
		{"bad duration", []string{"--set", "limiterd.shutdownTimeout=15"},
			[]string{"/limiterd/shutdownTimeout"}},
		{"bad PDB percentage", []string{"--set", "limiterd.podDisruptionBudget.minAvailable=half"},
			[]string{"/limiterd/podDisruptionBudget/minAvailable"}},
		{"redis store without an address", []string{"--set", "limiterd.store.type=redis"},
			[]string{"/limiterd/store/redis/addrs"}},
		{"sentinel master without sentinels", []string{"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.sentinel.masterName=m"},
			[]string{"/limiterd/store/redis/sentinel/addrs"}},
		{"sentinel address without a port", []string{"--set", "limiterd.store.redis.sentinel.addrs={sentinel}"},
			[]string{"/limiterd/store/redis/sentinel/addrs/0"}},
		{"admin namespace that is not a namespace name", []string{"--set", "networkPolicy.admin.namespaces={Monitoring}"},
			[]string{"/networkPolicy/admin/namespaces/0"}},
		{"admin namespaces as a selector", []string{"--set", "networkPolicy.admin.namespaces.matchLabels.team=ops"},
			[]string{"/networkPolicy/admin/namespaces", "want array"}},
		{"empty decisions peer, which NetworkPolicy reads as every source", []string{"--set-json", "networkPolicy.decisions.from=[{}]"},
			[]string{"/networkPolicy/decisions/from/0"}},
		{"decisions peer with an IP block and a selector", []string{"--set-json", `networkPolicy.decisions.from=[{"ipBlock":{"cidr":"10.0.0.0/8"},"podSelector":{}}]`},
			[]string{"/networkPolicy/decisions/from/0"}},
		{"allowed host with a port", []string{"--set-json", `limiterd.extraAllowedHosts=["gateway:8080"]`},
			[]string{"/limiterd/extraAllowedHosts/0"}},
		{"allowed host that is an IP address, which is always answered", []string{"--set-json", `limiterd.extraAllowedHosts=["10.0.0.7"]`},
			[]string{"/limiterd/extraAllowedHosts/0"}},
		{"allowed hosts as a string", []string{"--set", "limiterd.extraAllowedHosts=gateway"},
			[]string{"/limiterd/extraAllowedHosts", "want array"}},
		{"cluster domain that is not a DNS name", []string{"--set", "clusterDomain=Cluster.Local."},
			[]string{"/clusterDomain"}},
		{"unknown key in a decisions peer", []string{"--set-json", `networkPolicy.decisions.from=[{"namespaceSelectors":{}}]`},
			[]string{"/networkPolicy/decisions/from/0", "additional properties 'namespaceSelectors' not allowed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := renderErr(t, tc.args...)
			if !strings.Contains(out, "values don't meet the specifications of the schema") {
				t.Errorf("error is not the schema's:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("error does not mention %q:\n%s", w, out)
				}
			}
		})
	}
	t.Run("helm lint --strict refuses them too", func(t *testing.T) {
		t.Parallel()
		out, errOut, err := runHelm(t, "lint", "--strict", chartRel, "--set", "limiterd.replicaCount=two")
		if err == nil || !strings.Contains(out+errOut, "/limiterd/replicaCount") {
			t.Errorf("helm lint accepted a wrong type or did not name it (err %v):\n%s%s", err, out, errOut)
		}
	})
}

// TestSchemaMatchesValues checks that values.schema.json and values.yaml describe the same keys:
// every documented key resolves in the schema, and every object of the schema that values.yaml
// documents key by key allows exactly those keys.
func TestSchemaMatchesValues(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(chartDir(t), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if schema["$schema"] != "http://json-schema.org/draft-07/schema#" {
		t.Errorf("$schema = %v, want draft-07", schema["$schema"])
	}
	values := valueKeys(t)
	resolve := func(node map[string]any) map[string]any {
		for {
			ref, ok := node["$ref"].(string)
			if !ok {
				return node
			}
			name, ok := strings.CutPrefix(ref, "#/definitions/")
			if !ok {
				t.Fatalf("unsupported $ref %q", ref)
			}
			node = schema["definitions"].(map[string]any)[name].(map[string]any)
		}
	}
	lookup := func(key string) map[string]any {
		node := schema
		for _, part := range strings.Split(key, ".") {
			node = resolve(node)
			props, _ := node["properties"].(map[string]any)
			next, ok := props[part].(map[string]any)
			if !ok {
				return nil
			}
			node = next
		}
		return resolve(node)
	}
	children := map[string][]string{}
	for _, v := range values {
		node := lookup(v.Key)
		if node == nil {
			t.Errorf("values.yaml key %s is not in values.schema.json", v.Key)
			continue
		}
		i := strings.LastIndex(v.Key, ".")
		parent := ""
		if i >= 0 {
			parent = v.Key[:i]
		}
		children[parent] = append(children[parent], v.Key[i+1:])
		if ap, ok := node["additionalProperties"]; v.Section && (!ok || ap != false) {
			t.Errorf("schema of section %s does not forbid unknown keys (additionalProperties: false)", v.Key)
		}
	}
	if ap, ok := schema["additionalProperties"]; !ok || ap != false {
		t.Errorf("the schema's root does not forbid unknown keys")
	}
	for parent, kids := range children {
		node := schema
		if parent != "" {
			node = lookup(parent)
		}
		props, _ := resolve(node)["properties"].(map[string]any)
		var allowed []string
		for k := range props {
			allowed = append(allowed, k)
		}
		slices.Sort(allowed)
		slices.Sort(kids)
		if !slices.Equal(allowed, kids) {
			t.Errorf("section %q: schema allows %v, values.yaml documents %v", parent, allowed, kids)
		}
	}
}
