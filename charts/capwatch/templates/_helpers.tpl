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

{{/*
The cluster controller (controller.enabled). Its own name label, not only its
own component: the DaemonSet's selector (name and instance, immutable once
installed) must match no pod it does not own, and neither must the agents'
Service, ServiceMonitor and NetworkPolicy.
*/}}
{{- define "capwatch.controller.name" -}}
{{- printf "%s-controller" (include "capwatch.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
At most 52 characters: a StatefulSet's pods carry controller-revision-hash
<name>-<10-character hash>, a label value of at most 63.
*/}}
{{- define "capwatch.controller.fullname" -}}
{{- printf "%s-controller" (include "capwatch.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- /* Shard K's Lease: the release's, and the shard count's, so that two releases in
one namespace never share one and the pods of two shard counts never contend for
one while a change of controller.shards rolls out. The controller derives the same
name from --release and --shards. Called with (list $ K). */ -}}
{{- define "capwatch.controller.leaseName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-controller-%d-of-%d" $root.Release.Name (int (index . 1)) (int $root.Values.controller.shards) -}}
{{- end }}

{{- define "capwatch.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "capwatch.controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "capwatch.controller.labels" -}}
helm.sh/chart: {{ include "capwatch.chart" . }}
{{ include "capwatch.controller.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: {{ include "capwatch.name" . }}
{{- end }}

{{/* The cleanup hook's objects: a name of their own, so no selector above takes its pod. */}}
{{- define "capwatch.cleanup.labels" -}}
helm.sh/chart: {{ include "capwatch.chart" . }}
app.kubernetes.io/name: {{ printf "%s-cleanup" (include "capwatch.controller.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: controller-cleanup
app.kubernetes.io/part-of: {{ include "capwatch.name" . }}
{{- end }}

{{/* The agent pods of this release, exactly: the controller's --agent-selector. */}}
{{- define "capwatch.agentSelector" -}}
{{- printf "app.kubernetes.io/name=%s,app.kubernetes.io/component=node-agent,app.kubernetes.io/instance=%s" (include "capwatch.name" .) .Release.Name }}
{{- end }}

{{- define "capwatch.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "capwatch.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The post-delete cleanup hook's own account (the release's is gone by then). */}}
{{- define "capwatch.controller.cleanupName" -}}
{{- printf "%s-cleanup" (include "capwatch.controller.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name the agents' certificate carries, which the controller checks (it dials pod IPs). */}}
{{- define "capwatch.controller.agentServerName" -}}
{{- default (printf "%s.%s.svc" (include "capwatch.fullname" .) .Release.Namespace) .Values.controller.agentTls.serverName }}
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
{{- $caps := .Values.agent.caps }}
{{- if and $caps.floorWatts $caps.ceilingWatts (gt (int $caps.floorWatts) (int $caps.ceilingWatts)) }}
{{- fail (printf "agent.caps.floorWatts (%d) must not be above agent.caps.ceilingWatts (%d)" (int $caps.floorWatts) (int $caps.ceilingWatts)) }}
{{- end }}
{{- if and .Values.dra.simDriver.enabled (ne .Values.agent.gpuBackend "sim") }}
{{- fail (printf "dra.simDriver.enabled needs agent.gpuBackend sim, got %s: real GPUs are prepared by their own DRA driver, which can read capwatch's health stream instead (docs/dra-health.md)" .Values.agent.gpuBackend) }}
{{- end }}
{{- if .Values.controller.enabled }}
{{- include "capwatch.controller.validate" . }}
{{- end }}
{{- end }}

{{/* The controller's rules across keys (controller.enabled only). */}}
{{- define "capwatch.controller.validate" -}}
{{- $c := .Values.controller }}
{{- $lease := float64 $c.leaseDurationSeconds }}
{{- $renew := float64 $c.renewDeadlineSeconds }}
{{- $retry := float64 $c.retryPeriodSeconds }}
{{- if not (and (gt $lease $renew) (gt $renew $retry) (gt $retry 0.0)) }}
{{- fail (printf "controller.leaseDurationSeconds (%g) > controller.renewDeadlineSeconds (%g) > controller.retryPeriodSeconds (%g) > 0 must hold: a leader stops writing at the renew deadline, and the margin up to the lease duration is what keeps a standby from taking over while it may still write" $lease $renew $retry) }}
{{- end }}
{{- /* A clean stop: the cluster stream's 2 s, the writes in flight (bounded by the
renew deadline and a 10 s request timeout), then the Lease release (one attempt). */}}
{{- $stop := addf 2.0 (minf $renew 10.0) (maxf $retry (divf $renew 2.0)) }}
{{- $grace := int $c.terminationGracePeriodSeconds }}
{{- if le (float64 $grace) $stop }}
{{- fail (printf "controller.terminationGracePeriodSeconds (%d) must exceed %g s, the controller's longest clean stop (2 s for the cluster stream, up to min(renewDeadlineSeconds, 10) for the last writes, max(retryPeriodSeconds, renewDeadlineSeconds / 2) to release the Lease): killed sooner, it leaves its Lease to expire and the shard unwritten for up to leaseDurationSeconds" $grace $stop) }}
{{- end }}
{{- $grpcPort := int $c.grpcPort }}
{{- $metricsPort := int $c.metricsPort }}
{{- if or (eq $grpcPort $metricsPort) (eq $grpcPort 8082) (eq $metricsPort 8082) }}
{{- fail (printf "controller.grpcPort (%d), controller.metricsPort (%d) and the probe port 8082 must all differ" $grpcPort $metricsPort) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (eq $metricsPort 0) }}
{{- fail "serviceMonitor.enabled with controller.enabled needs the controller's metrics: controller.metricsPort is 0 (disabled)" }}
{{- end }}
{{- $tls := .Values.grpc.tls }}
{{- if and (not $tls.secretName) (or $c.agentTls.caSecretName $c.agentTls.clientSecretName $c.agentTls.serverName) }}
{{- fail "controller.agentTls needs grpc.tls.secretName: the agents serve plaintext, so the controller dials them without TLS" }}
{{- end }}
{{- if and $tls.clientCA.secretName (not $c.agentTls.clientSecretName) }}
{{- fail "grpc.tls.clientCA.secretName with controller.enabled needs controller.agentTls.clientSecretName: the agents require a client certificate signed by that CA, and the controller has none to present" }}
{{- end }}
{{- if and $c.cleanupOnDelete (not .Values.rbac.create) $c.serviceAccount.create }}
{{- fail "controller.cleanupOnDelete with rbac.create false needs controller.serviceAccount.create false and controller.serviceAccount.name: the cleanup hook runs after the release's own objects are deleted, so it needs an account you keep (granted list on nodes and patch on nodes/status)" }}
{{- end }}
{{- end }}
