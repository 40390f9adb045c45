// Package incluster tells a process what it knows of the Kubernetes pod it runs in.
package incluster

import (
	"os"
	"strings"
)

// NamespaceFile holds the namespace of the pod, mounted with its service account's token.
const NamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Namespace returns the namespace of the pod the process runs in: the content of NamespaceFile
// without surrounding white space, or "" when it cannot be read or is empty (not in a pod).
func Namespace() string { return namespaceIn(NamespaceFile) }

func namespaceIn(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
