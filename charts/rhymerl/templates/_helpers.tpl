{{/* Names are cut to 63 characters: Kubernetes names and label values end there. */}}
{{- define "rhymerl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rhymerl.fullname" -}}
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

{{- define "rhymerl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rhymerl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rhymerl
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rhymerl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rhymerl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rhymerl.operatorSelector" -}}
{{ include "rhymerl.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rhymerl.redisSelector" -}}
{{ include "rhymerl.selectorLabels" . }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "rhymerl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rhymerl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rhymerl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "rhymerl.redisName" -}}
{{- printf "%s-redis" (include "rhymerl.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rhymerl.redisSecretName" -}}
{{- default (include "rhymerl.redisName" .) .Values.redis.auth.existingSecret }}
{{- end }}

{{/*
What the operator does, and no more: converge each RLJob's children (StatefulSets, headless Services,
the spec ConfigMap, PodDisruptionBudgets and the controller pod's ServiceAccount/Role/RoleBinding),
write RLJob status, read pods to tell crashes from spot preemptions and unschedulable pods, post
events. It may grant the per-job Role only because it holds the same rljobs/status permissions itself
(Kubernetes forbids granting what one does not have).
*/}}
{{- define "rhymerl.nodeRules" }}
{{- /* the nodes' taints (operator/reconcile/nodes.py): read only */}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- end }}
{{- define "rhymerl.operatorRules" }}
{{- /* delete: a finished job whose ttl_seconds_after_finished ran out */}}
- apiGroups: [rhymerl.io]
  resources: [rljobs]
  verbs: [get, list, watch, patch, update, delete]
- apiGroups: [rhymerl.io]
  resources: [rljobs/status]
  verbs: [get, patch, update]
- apiGroups: [rhymerl.io]
  resources: [rljobs/finalizers]
  verbs: [update]
- apiGroups: [rhymerl.io]
  resources: [rljobs/scale]
  verbs: [get]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, update, delete]
{{- /* each job's Ray token: created once, never read, listed or changed (deleted with its RLJob) */}}
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch, list]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* The namespaces the operator watches (watchNamespace: one name, or a list) as a JSON list; empty: all. */}}
{{- define "rhymerl.watchNamespaces" -}}
{{- $named := .Values.operator.watchNamespace }}
{{- $all := kindIs "string" $named | ternary (compact (list $named)) ($named | default list) }}
{{- $all | uniq | toJson }}
{{- end }}

{{/* Cluster-scoped objects carry the release's namespace too: two releases of one name in two
namespaces (Helm allows it) must not claim the same ClusterRole. */}}
{{- define "rhymerl.clusterName" -}}
{{- printf "%s-%s" (include "rhymerl.fullname" .) .Release.Namespace }}
{{- end }}
