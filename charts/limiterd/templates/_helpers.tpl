{{/*
limiterd.name: the chart name, or nameOverride; cut to 63 characters (a label value's limit).
*/}}
{{- define "limiterd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
limiterd.fullname: the base name of every object: fullnameOverride, or the release name followed
by the chart name unless the release name already contains it. Cut to 52 characters so that
suffixes such as "-operator-metrics" keep names within 63.
*/}}
{{- define "limiterd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
limiterd.operatorFullname: the name of the operator's objects.
*/}}
{{- define "limiterd.operatorFullname" -}}
{{- printf "%s-operator" (include "limiterd.fullname" .) }}
{{- end }}

{{/*
limiterd.chart: the value of the helm.sh/chart label, "<name>-<version>".
*/}}
{{- define "limiterd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
limiterd.labels: the labels of every object (no component); commonLabels are added last.
*/}}
{{- define "limiterd.labels" -}}
helm.sh/chart: {{ include "limiterd.chart" . }}
app.kubernetes.io/name: {{ include "limiterd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: limiterd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
limiterd.selectorLabels: the labels that select the pods of the release (no component). Never
change them: a Deployment's selector is immutable.
*/}}
{{- define "limiterd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "limiterd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
limiterd.limiterdLabels: the labels of limiterd's objects (component "limiterd").
*/}}
{{- define "limiterd.limiterdLabels" -}}
{{ include "limiterd.labels" . }}
app.kubernetes.io/component: limiterd
{{- end }}

{{/*
limiterd.limiterdSelectorLabels: the labels selecting limiterd's pods.
*/}}
{{- define "limiterd.limiterdSelectorLabels" -}}
{{ include "limiterd.selectorLabels" . }}
app.kubernetes.io/component: limiterd
{{- end }}

{{/*
limiterd.operatorLabels: the labels of the operator's objects (component "operator").
*/}}
{{- define "limiterd.operatorLabels" -}}
{{ include "limiterd.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
limiterd.operatorSelectorLabels: the labels selecting the operator's pods.
*/}}
{{- define "limiterd.operatorSelectorLabels" -}}
{{ include "limiterd.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
limiterd.limiterdServiceAccountName: the ServiceAccount limiterd runs as: serviceAccount.name,
else the full name when the chart creates it, else "default".
*/}}
{{- define "limiterd.limiterdServiceAccountName" -}}
{{- if .Values.limiterd.serviceAccount.create }}
{{- default (include "limiterd.fullname" .) .Values.limiterd.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.limiterd.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
limiterd.operatorServiceAccountName: the ServiceAccount the operator runs as, chosen like
limiterd's.
*/}}
{{- define "limiterd.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "limiterd.operatorFullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
limiterd.replicaStatusPolicyName: the name of the ValidatingAdmissionPolicy, and of its binding,
that keep limiterd to its own status Lease: "<full name>-replica-status.<release namespace>". They
are cluster-scoped, and a release's name is unique only within its namespace, so the name carries
the namespace (which has no dot: the part after the last dot).
*/}}
{{- define "limiterd.replicaStatusPolicyName" -}}
{{- printf "%s-replica-status.%s" (include "limiterd.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
limiterd.image: an image reference from an image value (repository, tag, digest) and the root
context: "repository@digest" when a digest is given, else "repository:tag" with the chart's
appVersion as the default tag. Call it with (dict "image" .Values.x.image "root" $).
*/}}
{{- define "limiterd.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
limiterd.redisPasswordDir: where the Redis password Secret is mounted in limiterd's container.
*/}}
{{- define "limiterd.redisPasswordDir" -}}/etc/limiterd/redis-password{{- end }}

{{/*
limiterd.reservationKeyDir: where the reservation key Secret is mounted in limiterd's container.
*/}}
{{- define "limiterd.reservationKeyDir" -}}/etc/limiterd/reservation-key{{- end }}

{{/*
limiterd.reservationKeySecretName: the Secret holding the key that signs refund reservations.
*/}}
{{- define "limiterd.reservationKeySecretName" -}}
{{- .Values.limiterd.reservationKey.existingSecret | default (printf "%s-reservation-key" (include "limiterd.fullname" .)) }}
{{- end }}

{{/*
limiterd.redisSentinelPasswordDir: where the Redis Sentinels' password Secret is mounted in
limiterd's container.
*/}}
{{- define "limiterd.redisSentinelPasswordDir" -}}/etc/limiterd/redis-sentinel-password{{- end }}

{{/*
limiterd.redisTLSDir: where the Redis TLS Secret is mounted in limiterd's container.
*/}}
{{- define "limiterd.redisTLSDir" -}}/etc/limiterd/redis-tls{{- end }}

{{/*
limiterd.validate: fails the rendering on combinations of values the schema cannot express
across keys; included by the limiterd Deployment.
*/}}
{{- define "limiterd.validate" -}}
{{- $store := .Values.limiterd.store }}
{{- $sentinel := $store.redis.sentinel }}
{{- if and (eq $store.type "redis") (not $store.redis.addrs) (not $sentinel.masterName) }}
{{- fail "limiterd.store.redis.addrs needs an address when limiterd.store.type is redis (or give limiterd.store.redis.sentinel)" }}
{{- end }}
{{- if and $store.redis.addrs $sentinel.masterName }}
{{- fail "limiterd.store.redis.addrs and limiterd.store.redis.sentinel exclude each other: give the Redis servers, or the Sentinels (sentinel.addrs) and the master's name" }}
{{- end }}
{{- if ne (empty $sentinel.masterName) (empty $sentinel.addrs) }}
{{- fail "limiterd.store.redis.sentinel.masterName and limiterd.store.redis.sentinel.addrs must be given together" }}
{{- end }}
{{- $tls := $store.redis.tls }}
{{- if ne (empty $tls.certKey) (empty $tls.keyKey) }}
{{- fail "limiterd.store.redis.tls.certKey and limiterd.store.redis.tls.keyKey must be given together" }}
{{- end }}
{{- if and (eq $store.type "redis") $tls.enabled (or (not $tls.secretName) (not $tls.caKey)) }}
{{- fail "limiterd.store.redis.tls.enabled needs limiterd.store.redis.tls.secretName and caKey: the CA that verifies Redis (the images carry no CA bundle)" }}
{{- end }}
{{- $pdb := .Values.limiterd.podDisruptionBudget }}
{{- if and $pdb.enabled (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "limiterd.podDisruptionBudget: give minAvailable or maxUnavailable" }}
{{- end }}
{{- $rs := .Values.limiterd.replicaStatus }}
{{- $op := .Values.operator }}
{{- if and $rs.enabled $rs.restrictToOwnLease $op.enabled $op.leaderElection.enabled (eq (include "limiterd.limiterdServiceAccountName" .) (include "limiterd.operatorServiceAccountName" .)) }}
{{- fail (printf "limiterd.replicaStatus.restrictToOwnLease would refuse the operator's leader election Lease: limiterd and the operator both run as ServiceAccount %q; give them ServiceAccounts of their own, or set restrictToOwnLease to false" (include "limiterd.limiterdServiceAccountName" .)) }}
{{- end }}
{{- if and $op.enabled .Values.limiterd.configMapNamespace (ne .Values.limiterd.configMapNamespace .Release.Namespace) }}
{{- fail "limiterd.configMapNamespace is for a release whose operator is another release's (operator.enabled=false): this release's operator renders the policies into the release namespace" }}
{{- end }}
{{- $hpa := .Values.limiterd.autoscaling }}
{{- if and $hpa.enabled (gt (int $hpa.minReplicas) (int $hpa.maxReplicas)) }}
{{- fail "limiterd.autoscaling.minReplicas must not exceed maxReplicas" }}
{{- end }}
{{- if and $hpa.enabled (kindIs "invalid" $hpa.targetCPUUtilizationPercentage) (kindIs "invalid" $hpa.targetMemoryUtilizationPercentage) }}
{{- fail "limiterd.autoscaling needs targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" }}
{{- end }}
{{- end }}

{{/*
limiterd.goMemLimit: the GOMEMLIMIT of limiterd, .Values.limiterd.goMemLimit, or 90 % of the container's memory limit in
MiB; empty when neither is known.
*/}}
{{- define "limiterd.goMemLimit" -}}
{{- $l := .Values.limiterd -}}
{{- if $l.goMemLimit -}}
{{- $l.goMemLimit -}}
{{- else -}}
{{- $mem := toString (dig "limits" "memory" "" ($l.resources | default dict)) -}}
{{- $bytes := 0 -}}
{{- range $suffix, $factor := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- if and (hasSuffix $suffix $mem) (regexMatch "^[0-9]+$" (trimSuffix $suffix $mem)) -}}
{{- $bytes = mul (trimSuffix $suffix $mem | int64) $factor -}}
{{- end -}}
{{- end -}}
{{- if regexMatch "^[0-9]+$" $mem -}}
{{- $bytes = $mem | int64 -}}
{{- end -}}
{{- $mib := div (mul $bytes 9) 10485760 -}}
{{- if gt (int64 $mib) 0 -}}
{{- printf "%dMiB" (int64 $mib) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
limiterd.namespacesByName: a label selector matching the namespaces of a list of names, by the
kubernetes.io/metadata.name label the API server sets on every namespace.
*/}}
{{- define "limiterd.namespacesByName" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values:
      {{- toYaml . | nindent 6 }}
{{- end }}

{{/*
limiterd.operatorConfigMapsPolicyName: the name of the ValidatingAdmissionPolicy, and of its
binding, that narrow the operator's ConfigMap deletions outside the release namespace during the
upgrade step operator.legacyConfigMapCleanup:
"<full name>-operator-configmaps.<release namespace>" (cluster-scoped, see
limiterd.replicaStatusPolicyName).
*/}}
{{- define "limiterd.operatorConfigMapsPolicyName" -}}
{{- printf "%s-operator-configmaps.%s" (include "limiterd.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
limiterd.configMapNamespace: the namespace of the policy ConfigMaps: where this release's operator
renders them and limiterd reads them. limiterd.configMapNamespace, else the release namespace.
*/}}
{{- define "limiterd.configMapNamespace" -}}
{{- default .Release.Namespace .Values.limiterd.configMapNamespace }}
{{- end }}

{{/*
limiterd.tlsDir: where limiterd's serving TLS Secret is mounted in its container.
*/}}
{{- define "limiterd.tlsDir" -}}/etc/limiterd/tls{{- end }}

{{/*
limiterd.tlsSecretName: the Secret of limiterd's serving certificate: limiterd.tls.secretName,
or <fullname>-tls, the Secret of the chart's cert-manager Certificate.
*/}}
{{- define "limiterd.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "limiterd.fullname" .)) .Values.limiterd.tls.secretName }}
{{- end }}

{{/*
limiterd.serviceDNSNames: the DNS names of a Service of the release namespace, comma-separated:
<name>, <name>.<namespace>, <name>.<namespace>.svc and <name>.<namespace>.svc.<clusterDomain>.
Called with (dict "name" <Service name> "root" $).
*/}}
{{- define "limiterd.serviceDNSNames" -}}
{{- $ns := .root.Release.Namespace }}
{{- $domain := .root.Values.clusterDomain }}
{{- join "," (list .name (printf "%s.%s" .name $ns) (printf "%s.%s.svc" .name $ns) (printf "%s.%s.svc.%s" .name $ns $domain)) }}
{{- end }}

{{/*
limiterd.allowedHosts: limiterd's --allowed-hosts, comma-separated: the decisions Service's DNS
names (limiterd.serviceDNSNames) and limiterd.extraAllowedHosts.
*/}}
{{- define "limiterd.allowedHosts" -}}
{{- $names := splitList "," (include "limiterd.serviceDNSNames" (dict "name" (include "limiterd.fullname" .) "root" .)) }}
{{- join "," (concat $names .Values.limiterd.extraAllowedHosts) }}
{{- end }}
