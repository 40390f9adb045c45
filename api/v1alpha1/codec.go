package v1alpha1

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Kind is the kind of a RateLimitPolicy document.
const Kind = "RateLimitPolicy"

// DecodePolicies decodes limiterd's policy file format: a stream of RateLimitPolicy documents
// exactly as a user would kubectl apply them, either YAML documents separated by "---" lines or
// a sequence of JSON objects. Each document must have apiVersion limiterd.dev/v1alpha1 and kind
// RateLimitPolicy; fields are matched case-sensitively and unknown or duplicate fields are
// errors. Empty documents (nothing but comments, or null) are skipped.
//
// A document without namespace gets DefaultNamespace; each policy is then defaulted (Default)
// and validated (Validate). Two documents with the same namespace and name are an error.
// Errors name the document by its position among the non-empty documents, counted from 1,
// and by namespace/name when it could be read. A stream without documents yields no policies
// and no error.
func DecodePolicies(data []byte) ([]RateLimitPolicy, error) {
	docs, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	policies := make([]RateLimitPolicy, 0, len(docs))
	seen := make(map[PolicyID]int, len(docs))
	for i, doc := range docs {
		index := i + 1
		p, err := decodePolicy(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d%s: %w", index, describeDocument(doc), err)
		}
		key := p.ID()
		if first, ok := seen[key]; ok {
			return nil, fmt.Errorf("document %d (%s): same namespace and name as document %d", index, key, first)
		}
		seen[key] = index
		policies = append(policies, *p)
	}
	return policies, nil
}

// splitDocuments returns the non-empty documents of a stream, each as JSON: a sequence of JSON
// objects if the stream is one, else YAML documents separated by "---" lines (a JSON object is
// also a YAML document, so a YAML stream may start with one).
func splitDocuments(data []byte) ([][]byte, error) {
	if utilyaml.IsJSONBuffer(data) {
		if docs, err := splitJSON(data); err == nil {
			return docs, nil
		}
	}
	return splitYAML(data)
}

func splitJSON(data []byte) ([][]byte, error) {
	var docs [][]byte
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: invalid JSON: %w", len(docs)+1, err)
		}
		if !isNull(raw) {
			docs = append(docs, raw)
		}
	}
}

func splitYAML(data []byte) ([][]byte, error) {
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(docs)+1, err)
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: invalid YAML: %w", len(docs)+1, err)
		}
		if !isNull(j) {
			docs = append(docs, j)
		}
	}
}

func isNull(j []byte) bool {
	j = bytes.TrimSpace(j)
	return len(j) == 0 || string(j) == "null"
}

// documentHeader is what a document says of itself, read leniently to check its type and to
// name it in errors.
type documentHeader struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

func readHeader(doc []byte) (documentHeader, error) {
	var h documentHeader
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(doc, &h); err != nil {
		return h, fmt.Errorf("read apiVersion, kind and metadata: %w", err)
	}
	return h, nil
}

// describeDocument returns " (namespace/name)" for a document whose name can be read, else "".
func describeDocument(doc []byte) string {
	h, err := readHeader(doc)
	if err != nil || h.Metadata.Name == "" {
		return ""
	}
	return " (" + NewPolicyID(h.Metadata.Namespace, h.Metadata.Name).String() + ")"
}

// decodePolicy strictly decodes, defaults and validates one JSON document.
func decodePolicy(doc []byte) (*RateLimitPolicy, error) {
	p, err := decodeDocument(doc)
	if err != nil {
		return nil, err
	}
	if err := Validate(p); err != nil {
		return nil, fmt.Errorf("invalid: %w", err)
	}
	return p, nil
}

// decodeDocument strictly decodes one JSON document and applies the namespace and the defaults.
func decodeDocument(doc []byte) (*RateLimitPolicy, error) {
	h, err := readHeader(doc)
	if err != nil {
		return nil, fmt.Errorf("not a RateLimitPolicy: %w", err)
	}
	if h.APIVersion != GroupVersion.String() || h.Kind != Kind {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want apiVersion %q, kind %q",
			h.APIVersion, h.Kind, GroupVersion.String(), Kind)
	}
	p := new(RateLimitPolicy)
	strict, err := sigsjson.UnmarshalStrict(doc, p)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return nil, fmt.Errorf("strict decoding: %s", strings.Join(msgs, "; "))
	}
	p.Namespace = orDefaultNamespace(p.Namespace)
	p.Default()
	return p, nil
}
