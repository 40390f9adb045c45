package policy_test

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// The figures on which spec.gateway's key sources are a declarative list rather than CEL
// expressions over the request (issue 22; docs/benchmarks.md): BenchmarkKeyExtractionVsCEL
// derives the same key from the same request both ways. cel-go is imported here only, in a
// test, so that limiterd's binary does not carry it.

// celRequest is the activation of a CEL key expression: its one variable, request.headers,
// which is the request's headers as they come (an http.Header of a forward-auth request, the
// map of an ext_authz check), so that CEL pays no conversion.
type celRequest struct{ headers any }

func (a *celRequest) ResolveName(name string) (any, bool) {
	if name == "request.headers" {
		return a.headers, true
	}
	return nil, false
}

func (a *celRequest) Parent() interpreter.Activation { return nil }

// celCostLimit bounds a key expression's evaluation as Kubernetes bounds a
// ValidatingAdmissionPolicy's: an expression that outside input can make expensive (a split
// of a long X-Forwarded-For) must be bounded, and the bound is paid for on every evaluation.
const celCostLimit = 10_000

// compileKeyExpression compiles a key expression over request.headers, of type headers,
// into a program evaluated per request, as a policy's would be compiled once when loaded,
// with celCostLimit when limited.
func compileKeyExpression(tb testing.TB, headers *cel.Type, expr string, limited bool) cel.Program {
	tb.Helper()
	env, err := cel.NewEnv(
		cel.Variable("request.headers", headers),
		ext.Strings(), ext.Network(), ext.Bindings(),
	)
	if err != nil {
		tb.Fatal(err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		tb.Fatalf("compile %s: %v", expr, iss.Err())
	}
	if !ast.OutputType().IsExactType(cel.StringType) {
		tb.Fatalf("%s: of type %v, want string", expr, ast.OutputType())
	}
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if limited {
		opts = append(opts, cel.CostLimit(celCostLimit))
	}
	prg, err := env.Program(ast, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return prg
}

// appendCELKey evaluates prg for headers and appends its key to dst, as KeyExtractor.AppendKey
// does: nothing and false for an empty key.
func appendCELKey(tb testing.TB, dst []byte, prg cel.Program, headers any) ([]byte, bool) {
	out, _, err := prg.Eval(&celRequest{headers: headers})
	if err != nil {
		tb.Fatal(err)
	}
	key := out.Value().(string)
	return append(dst, key...), key != ""
}

// The CEL expressions of the key sources the benchmark compares, as close to what the key
// sources do as CEL reasonably allows: a Header source's value, bounded, given once; a
// ClientAddress source's entry two hops from the right of X-Forwarded-For, checked to be an
// IP address and canonicalised (without the key sources' ports, brackets and IPv6 /64s, which
// would cost CEL more). CEL splits the whole of X-Forwarded-For, the entries a client sent too,
// where the key source reads only the trusted entries from the right.
const (
	// Of an http.Header (a forward-auth request): canonical names, lists of lines.
	celHeaderForwarded = `'X-Api-Key' in request.headers && size(request.headers['X-Api-Key']) == 1 &&
		size(request.headers['X-Api-Key'][0]) <= 4096 ? 'header:x-api-key:' + request.headers['X-Api-Key'][0] : ''`
	celClientAddressForwarded = `'X-Forwarded-For' in request.headers ?
		cel.bind(xs, request.headers['X-Forwarded-For'].join(',').split(','),
			size(xs) >= 2 && isIP(xs[size(xs) - 2].trim()) ? 'ip:' + string(ip(xs[size(xs) - 2].trim())) : '') : ''`
	// Of an ext_authz check's map: lower-case names, one value each.
	celHeaderChecked = `'x-api-key' in request.headers && size(request.headers['x-api-key']) <= 4096 ?
		'header:x-api-key:' + request.headers['x-api-key'] : ''`
	celClientAddressChecked = `'x-forwarded-for' in request.headers ?
		cel.bind(xs, request.headers['x-forwarded-for'].split(','),
			size(xs) >= 2 && isIP(xs[size(xs) - 2].trim()) ? 'ip:' + string(ip(xs[size(xs) - 2].trim())) : '') : ''`
)

// BenchmarkKeyExtractionVsCEL derives the key of the same request with a key source
// (Declarative) and with a CEL program that does the same, compiled once and evaluated per
// request, without a cost limit (CEL) and with one (CELCostLimit), for a Header source and a
// ClientAddress source with two trusted hops, of a forward-auth request and of an ext_authz
// check. It fails when they derive different keys.
func BenchmarkKeyExtractionVsCEL(b *testing.B) {
	forwardedHeaders := cel.MapType(cel.StringType, cel.ListType(cel.StringType))
	checkedHeaders := cel.MapType(cel.StringType, cel.StringType)
	for _, bc := range []struct {
		name    string
		source  v1alpha1.KeySource
		request *policy.ForwardedRequest
		expr    string
		headers *cel.Type
	}{
		{"Header/ForwardAuth", v1alpha1.KeySource{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
			&policy.ForwardedRequest{Header: http.Header{"X-Api-Key": {"0123456789abcdef0123456789abcdef"}, "User-Agent": {"curl/8"}, "Accept": {"*/*"}}},
			celHeaderForwarded, forwardedHeaders},
		{"ClientAddress/ForwardAuth", v1alpha1.KeySource{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)},
			&policy.ForwardedRequest{Header: http.Header{"X-Forwarded-For": {"203.0.113.9, 198.51.100.7, 10.0.0.5"}, "User-Agent": {"curl/8"}}},
			celClientAddressForwarded, forwardedHeaders},
		{"Header/ExtAuthz", v1alpha1.KeySource{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
			&policy.ForwardedRequest{Checked: &policy.CheckedRequest{Headers: map[string]string{
				"x-api-key": "0123456789abcdef0123456789abcdef", "user-agent": "curl/8", "accept": "*/*"}}},
			celHeaderChecked, checkedHeaders},
		{"ClientAddress/ExtAuthz", v1alpha1.KeySource{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)},
			&policy.ForwardedRequest{Checked: &policy.CheckedRequest{Headers: map[string]string{
				"x-forwarded-for": "203.0.113.9, 198.51.100.7, 10.0.0.5", "user-agent": "curl/8"}}},
			celClientAddressChecked, checkedHeaders},
	} {
		x := gatewayPolicy(b, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{bc.source}}).Gateway
		var headers any = bc.request.Header
		if bc.request.Checked != nil {
			headers = bc.request.Checked.Headers
		}
		want, ok, err := x.AppendKey(nil, bc.request)
		if !ok || err != nil {
			b.Fatalf("%s: the key source yields no key (%v)", bc.name, err)
		}
		programs := map[string]cel.Program{}
		for _, limited := range []bool{false, true} {
			name := map[bool]string{false: "CEL", true: "CELCostLimit"}[limited]
			prg := compileKeyExpression(b, bc.headers, bc.expr, limited)
			if got, _ := appendCELKey(b, nil, prg, headers); string(got) != string(want) {
				b.Fatalf("%s/%s: CEL yields %q, the key source %q", bc.name, name, got, want)
			}
			programs[name] = prg
		}
		b.Run(bc.name+"/Declarative", func(b *testing.B) {
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				var ok bool
				if buf, ok, _ = x.AppendKey(buf[:0], bc.request); !ok {
					b.Fatal("no key")
				}
			}
		})
		for _, name := range []string{"CEL", "CELCostLimit"} {
			prg := programs[name]
			b.Run(bc.name+"/"+name, func(b *testing.B) {
				buf := make([]byte, 0, 256)
				b.ReportAllocs()
				defer reportCPU(b)()
				for b.Loop() {
					var ok bool
					if buf, ok = appendCELKey(b, buf[:0], prg, headers); !ok {
						b.Fatal("no key")
					}
				}
			})
		}
	}
}

// reportCPU starts measuring the process's CPU time (user and system, of every thread: the
// garbage collector's too); the function it returns reports it per op as cpu-ns/op, which a
// loaded machine disturbs less than ns/op.
func reportCPU(b *testing.B) func() {
	cpu0 := processCPU(b)
	return func() { b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op") }
}

// processCPU returns the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
