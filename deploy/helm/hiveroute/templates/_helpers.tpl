{{/* Chart name, truncated to the 63 characters Kubernetes allows in a name. */}}
{{- define "hiveroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release plus chart name, unless the release name already holds it. */}}
{{- define "hiveroute.fullname" -}}
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

{{- define "hiveroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hiveroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hiveroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hiveroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "hiveroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hiveroute.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The namespace the engines run in (where discovery watches pods). */}}
{{- define "hiveroute.engineNamespace" -}}
{{- default .Release.Namespace .Values.discovery.namespace }}
{{- end }}

{{/* The `state` setting: the chart's Redis, an external URL, or memory. */}}
{{- define "hiveroute.state" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s-redis:6379/0" (include "hiveroute.fullname" .) }}
{{- else if .Values.redis.externalUrl }}
{{- .Values.redis.externalUrl }}
{{- else }}
{{- "memory" }}
{{- end }}
{{- end }}

{{/* The router's configuration file: chart-derived keys, then router.config on top. */}}
{{- define "hiveroute.routerConfig" -}}
{{- $d := .Values.discovery }}
{{- $cfg := dict "host" "0.0.0.0" "port" (int .Values.router.port) "state" (include "hiveroute.state" .) }}
{{- if eq $d.mode "kubernetes" }}
{{- $_ := set $cfg "discovery" "kubernetes" }}
{{- $_ := set $cfg "k8s_namespace" (include "hiveroute.engineNamespace" .) }}
{{- $_ := set $cfg "k8s_label_selector" $d.labelSelector }}
{{- $_ := set $cfg "k8s_port" (int $d.port) }}
{{- $_ := set $cfg "k8s_scheme" $d.scheme }}
{{- $_ := set $cfg "k8s_events_port" (int $d.eventsPort) }}
{{- $_ := set $cfg "k8s_replay_port" (int $d.replayPort) }}
{{- else if eq $d.mode "static" }}
{{- if not $d.staticEngines }}
{{- fail "discovery.mode=static needs discovery.staticEngines (URL[,events=tcp://HOST:PORT] strings)" }}
{{- end }}
{{- $_ := set $cfg "discovery" "static" }}
{{- $_ := set $cfg "engine" $d.staticEngines }}
{{- else }}
{{- fail (printf "discovery.mode must be kubernetes or static, not %q" $d.mode) }}
{{- end }}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy (default (dict) .Values.router.config))) }}
{{- end }}
