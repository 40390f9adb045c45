// Package envoytest reads the Envoy configurations shipped in docs/gateways as Envoy would, and
// the chart's values they point at, for the tests that check them (limiterd's, and the Envoy
// Gateway module's). It is imported only by _test.go files.
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

// ChartGRPCPort reads limiterd.service.grpcPort, the port of the chart's decisions Service that
// serves gRPC, from the chart's values.yaml at path, failing t unless it is a port (1 to 65535).
func ChartGRPCPort(t testing.TB, path string) uint32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Limiterd struct {
			Service struct {
				GRPCPort uint32 `json:"grpcPort"`
			} `json:"service"`
		} `json:"limiterd"`
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	port := values.Limiterd.Service.GRPCPort
	if port == 0 || port > 65535 {
		t.Fatalf("%s: limiterd.service.grpcPort is %d, not a port", path, port)
	}
	return port
}
