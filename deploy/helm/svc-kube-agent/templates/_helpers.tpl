{{/* Name of the agent workload, its Secret and the updater, all derived from the release. */}}
{{- define "svc-kube-agent.name" -}}{{ .Release.Name }}{{- end -}}
{{- define "svc-kube-agent.updaterName" -}}{{ .Release.Name }}-updater{{- end -}}
{{- define "svc-kube-agent.sharedState" -}}{{ .Release.Name }}-shared-state{{- end -}}
{{/* The identity Secrets of the StatefulSet's replicas: <release>-<ordinal>-state, quoted, comma-separated. */}}
{{- define "svc-kube-agent.stateSecrets" -}}
{{- $names := list -}}
{{- range $i := until (int .Values.replicaCount) -}}
{{- $names = append $names (printf "%q" (printf "%s-%d-state" $.Release.Name $i)) -}}
{{- end -}}
{{- join ", " $names -}}
{{- end -}}
{{- define "svc-kube-agent.agentImage" -}}{{ .Values.image }}:{{ .Values.version | default .Chart.AppVersion | trimPrefix "v" }}{{- end -}}
{{- define "svc-kube-agent.updaterImage" -}}{{ .Values.updater.image }}:{{ .Values.updater.version | default .Chart.AppVersion | trimPrefix "v" }}{{- end -}}

{{- define "svc-kube-agent.labels" -}}
app.kubernetes.io/name: svc-kube-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "svc-kube-agent.selector" -}}
app.kubernetes.io/name: svc-kube-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{/* Checks that hold for every rendering. */}}
{{- define "svc-kube-agent.validate" -}}
{{- if and .Values.updater.enabled (not .Values.enterprise) -}}
{{- fail "updater.enabled=true requires enterprise=true: automatic updates are an Enterprise feature (set enterprise: true in the values file)" -}}
{{- end -}}
{{- if not (has .Values.workloadKind (list "statefulset" "deployment")) -}}
{{- fail (printf "workloadKind: expected statefulset or deployment, got %q" .Values.workloadKind) -}}
{{- end -}}
{{- if and .Values.updater.enabled (not (or .Values.updater.versionServer .Values.proxyAddr)) -}}
{{- fail "updater.enabled=true needs updater.versionServer or proxyAddr to know where to ask for versions" -}}
{{- end -}}
{{- end -}}
