{{/*
The chart's name, at most 63 characters (a label value).
*/}}
{{- define "coder-provisioner-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name, the base of every object's name: the release name when it already holds
the chart's name (`helm install coder-provisioner-operator …` names everything as config/ does),
else RELEASE-CHART. At most 63 characters.
*/}}
{{- define "coder-provisioner-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "coder-provisioner-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "coder-provisioner-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the operator's pods (all of them, whatever namespaces they watch).
*/}}
{{- define "coder-provisioner-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coder-provisioner-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{/*
The ServiceAccount the operator runs as.
*/}}
{{- define "coder-provisioner-operator.serviceAccountName" -}}
{{- default (include "coder-provisioner-operator.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/*
Whether the operator runs with leader election: as asked, and always with more than one replica.
Renders "true" or "false".
*/}}
{{- define "coder-provisioner-operator.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) }}true{{ else }}false{{ end }}
{{- end }}

{{/*
The operator's Deployments as a list of {name, namespace} (namespace "": every namespace), one per
watched namespace because the operator watches one namespace per process. Rendered as JSON.
*/}}
{{- define "coder-provisioner-operator.deployments" -}}
{{- $fullname := include "coder-provisioner-operator.fullname" . }}
{{- $deployments := list }}
{{- if not .Values.watchNamespaces }}
{{- $deployments = append $deployments (dict "name" $fullname "namespace" "") }}
{{- else if eq (len .Values.watchNamespaces) 1 }}
{{- $deployments = append $deployments (dict "name" $fullname "namespace" (first .Values.watchNamespaces)) }}
{{- else }}
{{- range .Values.watchNamespaces }}
{{- $name := printf "%s-%s" $fullname . }}
{{- if gt (len $name) 63 }}
{{- $name = printf "%s-%s" ($name | trunc 52 | trimSuffix "-") (sha256sum . | trunc 10) }}
{{- end }}
{{- $deployments = append $deployments (dict "name" $name "namespace" .) }}
{{- end }}
{{- end }}
{{- toJson $deployments }}
{{- end }}

{{/*
helm test: the control plane's namespace and name (test.controlPlane is NAMESPACE/NAME).
*/}}
{{- define "coder-provisioner-operator.test.controlPlaneNamespace" -}}
{{- $parts := splitList "/" (required "test.controlPlane (NAMESPACE/NAME of a Ready CoderControlPlane) is required when test.enabled" .Values.test.controlPlane) }}
{{- if ne (len $parts) 2 }}{{ fail "test.controlPlane must be NAMESPACE/NAME" }}{{ end }}
{{- first $parts }}
{{- end }}

{{/*
helm test: the name of the operator Deployment that reconciles the control plane's namespace
(the one watching every namespace, or the one watching that namespace).
*/}}
{{- define "coder-provisioner-operator.test.deployment" -}}
{{- $namespace := include "coder-provisioner-operator.test.controlPlaneNamespace" . }}
{{- $found := "" }}
{{- range include "coder-provisioner-operator.deployments" . | fromJsonArray }}
{{- if and (not $found) (or (eq .namespace "") (eq .namespace $namespace)) }}
{{- $found = .name }}
{{- end }}
{{- end }}
{{- if not $found }}
{{- fail (printf "test.controlPlane is in namespace %s, which no operator Deployment of this release watches (watchNamespaces)" $namespace) }}
{{- end }}
{{- $found }}
{{- end }}

{{/*
helm test: name of the suite's ServiceAccount and RBAC objects.
*/}}
{{- define "coder-provisioner-operator.test.name" -}}
{{- printf "%s-test" (include "coder-provisioner-operator.fullname" . | trunc 58 | trimSuffix "-") }}
{{- end }}
