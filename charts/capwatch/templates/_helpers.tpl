{{/* Names, labels and render-time checks shared by every template. */}}

{{- define "capwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "capwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "capwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "capwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "capwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "capwatch.labels" -}}
helm.sh/chart: {{ include "capwatch.chart" . }}
{{ include "capwatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "capwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "capwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "capwatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Render-time checks. values.schema.json rejects the same bad values first; these
also hold under --skip-schema-validation, and cover rules across several keys.
*/}}
{{- define "capwatch.validate" -}}
{{- $grace := int .Values.terminationGracePeriodSeconds }}
{{- if lt $grace 60 }}
{{- fail (printf "terminationGracePeriodSeconds must be at least 60, got %d: at SIGTERM the agent finishes its cycle and restores the default power limit on every GPU it capped; a shorter grace period lets the kubelet kill it mid-restore and leave GPUs capped for pods that are gone" $grace) }}
{{- end }}
{{- $shutdown := addf (float64 .Values.agent.shutdownGraceSeconds) (float64 .Values.grpc.graceSeconds) }}
{{- if ge $shutdown (float64 $grace) }}
{{- fail (printf "agent.shutdownGraceSeconds + grpc.graceSeconds (%g) must be less than terminationGracePeriodSeconds (%d), leaving time to restore default caps before the kubelet kills the agent" $shutdown $grace) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (eq (int .Values.metrics.port) 0) }}
{{- fail "serviceMonitor.enabled needs metrics: metrics.port is 0 (disabled), so the ServiceMonitor would scrape nothing" }}
{{- end }}
{{- if and .Values.grpc.tls.clientCA.secretName (not .Values.grpc.tls.secretName) }}
{{- fail "grpc.tls.clientCA.secretName needs grpc.tls.secretName: mutual TLS is TLS with client certificates, and the agent has no certificate of its own to serve" }}
{{- end }}
{{- if ge (int .Values.grpc.reservedLocalSubscribers) (int .Values.grpc.maxSubscribers) }}
{{- fail (printf "grpc.reservedLocalSubscribers (%d) must be less than grpc.maxSubscribers (%d): TCP clients would get no slot at all" (int .Values.grpc.reservedLocalSubscribers) (int .Values.grpc.maxSubscribers)) }}
{{- end }}
{{- if or (eq (int .Values.metrics.port) (int .Values.grpc.port)) (eq (int .Values.metrics.port) 8081) (eq (int .Values.grpc.port) 8081) }}
{{- fail (printf "grpc.port (%d), metrics.port (%d) and the readiness port 8081 must all differ" (int .Values.grpc.port) (int .Values.metrics.port)) }}
{{- end }}
{{- end }}
