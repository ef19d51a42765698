{{/* Names */}}
{{- define "gdn-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gdn-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gdn-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gdn-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gdn-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "gdn-operator.labels" -}}
helm.sh/chart: {{ include "gdn-operator.chart" . }}
{{ include "gdn-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gdn-operator
{{- end -}}

{{- define "gdn-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gdn-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gdn-operator.webhookService" -}}
{{- printf "%s-webhook" (include "gdn-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gdn-operator.metricsService" -}}
{{- printf "%s-metrics" (include "gdn-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gdn-operator.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "gdn-operator.fullname" .)) .Values.webhook.secretName -}}
{{- end -}}

{{- define "gdn-operator.peeringName" -}}
{{- default (include "gdn-operator.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "gdn-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* True (non-empty) when the operator watches every namespace. */}}
{{- define "gdn-operator.clusterWide" -}}
{{- if not .Values.operator.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* True (non-empty) when the operator itself creates per-server PodMonitors. */}}
{{- define "gdn-operator.operatorPodMonitors" -}}
{{- if eq .Values.monitoring.enginePodMonitor.mode "perServer" -}}true{{- end -}}
{{- end -}}

{{/* Selector of the engine pods the operator manages (labels set by gdn_operator/render/engine.py). */}}
{{- define "gdn-operator.engineSelector" -}}
app.kubernetes.io/managed-by: gdn-operator
app.kubernetes.io/component: engine
{{- end -}}

{{/*
Rules for the NAMESPACED resources the operator touches. Bound cluster-wide (ClusterRole) when it
watches all namespaces, or per watched namespace (Role). Every rule names the code that needs it;
tests/charts/test_chart_render.py holds the same table and fails on any extra resource or verb.
*/}}
{{- define "gdn-operator.namespacedRules" -}}
# kopf watches GDNModelServers (list, watch) and patches them (finalizer, kopf's progress annotations;
# kube.patch_server: the mitigations annotation); kube.get_server reads one (get).
- apiGroups: ["serving.gdn-operator.io"]
  resources: ["gdnmodelservers"]
  verbs: ["get", "list", "watch", "patch"]
# kube.update_status: one JSON patch of the changed status keys, guarded by `test` ops (no replace).
- apiGroups: ["serving.gdn-operator.io"]
  resources: ["gdnmodelservers/status"]
  verbs: ["patch"]
# Engine objects carry ownerReferences with blockOwnerDeletion: true; clusters running the
# OwnerReferencesPermissionEnforcement admission plugin (e.g. OpenShift) require update on finalizers.
- apiGroups: ["serving.gdn-operator.io"]
  resources: ["gdnmodelservers/finalizers"]
  verbs: ["update"]
# kube.apply (server-side apply: patch, plus create when the object does not exist yet);
# kube.get_deployment (get); kopf watches the engine Deployments for status and drift (list, watch).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"{{ if .Values.scaleOut.leaderWorkerSet.enabled }}, "delete"{{ end }}]
# kube.apply of the engine Service (server-side apply).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
# The engine PodDisruptionBudget (spec.disruptionBudget) and the cache claim the operator creates
# (spec.model.cache.persistentVolumeClaim.size): kube.apply (server-side apply), and the reconciler's
# clean-up (get, delete) when a spec stops rendering them.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch", "delete"]
{{- if .Values.operator.readApiKeySecrets }}
# operator.readApiKeySecrets: output probes of a server with spec.apiKeySecret send its key
# (handlers/engines/probes.py reads the one Secret the spec names; get only: no list or watch).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# kopf index + event handlers over the engine pods (status, restarts, unschedulable, crash watch);
# get: the crash watch checks whether a container instance still runs before re-following its log.
# delete, only with operator.stallRestart or guard.remediation.enabled: the stall detector restarts a stalled
# engine pod, once per generation (handlers/engines/stall.py), and a guard with remediation deletePod deletes a stalled or
# deterministically crashing pod (handlers/guard/supervisor.py); each delete carries the pod's uid as a precondition.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"{{ if or .Values.operator.stallRestart (and .Values.guard.enabled .Values.guard.remediation.enabled) }}, "delete"{{ end }}]
# Crash watch: read the logs of crashed / running engine containers.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
{{- if .Values.guard.enabled }}
# GDNGuard (issue 35): the guards (read; their status written as a JSON patch) and, read only, the workloads
# they select (deployments, pods and pods/log are read above for GDNModelServers already).
- apiGroups: ["serving.gdn-operator.io"]
  resources: ["gdnguards"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["serving.gdn-operator.io"]
  resources: ["gdnguards/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets", "replicasets"]
  verbs: ["get", "list", "watch"]
{{- if not .Values.scaleOut.leaderWorkerSet.enabled }}
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- if .Values.guard.policyReports }}
# guard.policyReports: one PolicyReport per namespace, the operator's (handlers/guardstatus.apply_policy_report:
# server-side apply; get to read it back).
- apiGroups: ["wgpolicyk8s.io"]
  resources: ["policyreports"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- end }}
# kube.emit_event and kopf's own event posting (core/v1 Events).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if include "gdn-operator.operatorPodMonitors" . }}
# monitoring.enginePodMonitor.mode=perServer: kube.apply of the per-server PodMonitor (server-side
# apply) and kube.delete_pod_monitor when a server turns metrics off.
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["create", "patch", "delete"]
{{- end }}
{{- if .Values.scaleOut.leaderWorkerSet.enabled }}
# scaleOut.leaderWorkerSet: multi-node engines. kube.apply (server-side apply), kopf watches them for
# status and drift, and the reconciler deletes the one left behind when spec.nodes crosses 1 (the
# Deployment delete above exists for the same reason).
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
{{- if .Values.scaleOut.autoscaling.hpa.enabled }}
# scaleOut.autoscaling.hpa: the per-server HorizontalPodAutoscaler (apply, read for the scale-up pause,
# delete when autoscaling is dropped or KEDA takes over).
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- if .Values.scaleOut.autoscaling.keda.enabled }}
# scaleOut.autoscaling.keda: the per-server KEDA ScaledObject (same verbs as the HPA).
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- if .Values.scaleOut.inferencePool.enabled }}
# scaleOut.inferencePool: the per-server InferencePool; kopf watches its status (Accepted/ResolvedRefs).
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- end }}
{{- end -}}

{{/* Rules for namespaced kopf peering (watch-namespace list mode). */}}
{{- define "gdn-operator.namespacedPeeringRules" -}}
{{- if .Values.peering.enabled }}
# kopf peering: watch the KopfPeering objects of this namespace, patch keep-alives into ours.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  resourceNames: [{{ include "gdn-operator.peeringName" . | quote }}]
  verbs: ["patch"]
{{- end }}
{{- end -}}

{{/* runbook_url of an alert: monitoring.prometheusRule.runbookBaseUrl + "/" + <alert>.md (docs/runbooks/ in the repo). */}}
{{- define "gdn-operator.runbookUrl" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s.md" (trimSuffix "/" $root.Values.monitoring.prometheusRule.runbookBaseUrl) (index . 1) -}}
{{- end -}}
