// Package envoytest reads the Envoy configurations shipped in docs/gateways as Envoy would, for
// the tests that check them. It is imported only by _test.go files.
package envoytest

import (
	"os"
	"testing"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

// LoadHCM decodes the YAML file at path as the typed_config of an
// envoy.filters.network.http_connection_manager filter (protojson: unknown fields refused) and
// validates it with go-control-plane's generated rules, failing t on any error. The types of
// the typed_configs the file names must be linked into the test (import their packages).
func LoadHCM(t testing.TB, path string) *hcmv3.HttpConnectionManager {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := protojson.Unmarshal(j, &hcm); err != nil {
		t.Fatalf("%s: decode: %v", path, err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("%s: validate: %v", path, err)
	}
	return &hcm
}
