{{/* The image reference: repository, tag (default: the chart's appVersion), digest. */}}
{{- define "idemd.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- .Values.image.repository }}:{{ $tag }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* Labels of one component's objects and pods: the kustomize base's, plus Helm's. */}}
{{- define "idemd.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: idemd
{{- end }}

{{- define "idemd.labels" -}}
{{ include "idemd.selectorLabels" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ .root.Chart.Name }}-{{ .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Restricted Pod Security: the pod's securityContext. */}}
{{- define "idemd.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Restricted Pod Security: every container's securityContext. */}}
{{- define "idemd.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The pod spec's common head: no service account token, no service links
(a Service named "idemd" would become IDEMD_PORT, which kong reads as a
flag), pull secrets.
*/}}
{{- define "idemd.podCommon" -}}
serviceAccountName: idemd
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The probes of a long-running daemon on its metrics port. */}}
{{- define "idemd.probes" -}}
# /readyz: the database answers and the last pass is recent.
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
# /healthz does not touch the database: an outage makes the pod unready,
# it must not make the kubelet restart it.
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
{{- end }}

{{/* DATABASE_URL from the Secret key .key, and the password and user files if any. */}}
{{- define "idemd.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.database.secretName }}
      key: {{ .key }}
{{- with .passwordFile }}
- name: IDEMD_DATABASE_PASSWORD_FILE
  value: {{ . | quote }}
{{- end }}
{{- with .userFile }}
{{- if not $.passwordFile }}
{{- fail "database.userFile (or migrateUserFile) needs database.passwordFile (or migratePasswordFile): the user and the password rotate together" }}
{{- end }}
- name: IDEMD_DATABASE_USER_FILE
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* A checksum of the ConfigMaps a pod reads, so a change rolls it (kustomize's name hash does the same). */}}
{{- define "idemd.configChecksum" -}}
checksum/config: {{ dict "common" .root.Values.common.config "own" .config | toJson | sha256sum }}
{{- end }}

{{/* Pod annotations: the config checksum and podAnnotations. */}}
{{- define "idemd.podAnnotations" -}}
{{ include "idemd.configChecksum" . }}
{{- with .root.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}
