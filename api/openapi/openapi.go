// Package openapi holds the OpenAPI 3.1 description of limiterd's HTTP APIs, the decisions API
// and the admin API (openapi.yaml), which the admin API serves at /openapi.yaml and
// limiterd/server's tests check every answer of the handlers against.
//
// It is a package of its own, beside the CRD types, because go:embed reads only files under the
// embedding package's directory: the spec lives where API descriptions live, and the server
// and its tests import it from here.
package openapi

import _ "embed"

// Spec is openapi.yaml: the OpenAPI 3.1 document of the decisions and admin APIs.
//
//go:embed openapi.yaml
var Spec []byte
