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
idemd.settings: the pod settings one workload gets, as JSON (read back
with fromJson): each standard value of the component (.c, the values of
enqueuer, completer, reaper, console or migrate) over the global one of
the same name. Maps (podAnnotations, podLabels, nodeSelector) merge key by
key, the component's winning; lists, objects and strings (tolerations,
affinity, topologySpreadConstraints, priorityClassName, extraEnv,
extraEnvFrom, extraVolumes, extraVolumeMounts) are the component's when it
sets them, else the global's. The migration Job takes no global
ServiceAccount name: on a first install its pre-install hook runs before
the chart's ServiceAccount exists.
*/}}
{{- define "idemd.settings" -}}
{{- $v := .root.Values -}}
{{- $c := .c -}}
{{- $out := dict -}}
{{- range $k := list "podAnnotations" "podLabels" "nodeSelector" -}}
{{- $_ := set $out $k (merge (deepCopy (index $c $k | default dict)) (deepCopy (index $v $k | default dict))) -}}
{{- end -}}
{{- range $k := list "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" "extraEnv" "extraEnvFrom" "extraVolumes" "extraVolumeMounts" -}}
{{- $_ := set $out $k (index $c $k | default (index $v $k)) -}}
{{- end -}}
{{- $sa := $c.serviceAccount | default dict -}}
{{- $name := $sa.name -}}
{{- if and (not $name) (ne .name "migrate") -}}
{{- $name = include "idemd.serviceAccountName" .root -}}
{{- end -}}
{{- $_ := set $out "serviceAccountName" $name -}}
{{- $automount := $v.serviceAccount.automountServiceAccountToken -}}
{{- if kindIs "bool" $sa.automountServiceAccountToken -}}
{{- $automount = $sa.automountServiceAccountToken -}}
{{- end -}}
{{- $_ := set $out "automountServiceAccountToken" $automount -}}
{{- toJson $out -}}
{{- end }}

{{/* The ServiceAccount the workloads run as: the chart's, or an existing one. */}}
{{- define "idemd.serviceAccountName" -}}
{{- if and (not .Values.serviceAccount.create) (not .Values.serviceAccount.name) -}}
{{- fail "serviceAccount.create is false: serviceAccount.name must name an existing ServiceAccount" -}}
{{- end -}}
{{- .Values.serviceAccount.name | default "idemd" -}}
{{- end }}

{{/*
The pod template's labels: podLabels (global and the component's), then
the selector labels, which a podLabels entry cannot replace (the
Deployment's selector and the NetworkPolicies match them).
*/}}
{{- define "idemd.podLabels" -}}
{{- $labels := merge (fromYaml (include "idemd.selectorLabels" .)) .s.podLabels -}}
{{- toYaml $labels }}
{{- end }}

{{/*
The pod spec's common head: the ServiceAccount and whether its token is
mounted (serviceAccount, per component), no service links (a Service
named "idemd" would become IDEMD_PORT, which kong reads as a flag), pull
secrets, and the placement values (priorityClassName, nodeSelector,
affinity, tolerations, topologySpreadConstraints; without any, the
Deployments spread over nodes). .s is idemd.settings' result.
*/}}
{{- define "idemd.podCommon" -}}
{{- with .s.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
automountServiceAccountToken: {{ .s.automountServiceAccountToken }}
enableServiceLinks: false
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .s.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .s.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .s.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .s.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $spread := .s.topologySpreadConstraints }}
{{- if and (not $spread) .spreadByDefault }}
{{- $spread = list (dict "maxSkew" 1 "topologyKey" "kubernetes.io/hostname" "whenUnsatisfiable" "ScheduleAnyway") }}
{{- end }}
{{- if $spread }}
# A constraint without a labelSelector counts this component's pods.
topologySpreadConstraints:
  {{- range $spread }}
  {{- $tsc := deepCopy . }}
  {{- if not (hasKey $tsc "labelSelector") }}
  {{- $_ := set $tsc "labelSelector" (dict "matchLabels" (fromYaml (include "idemd.selectorLabels" $))) }}
  {{- end }}
  - {{ toYaml $tsc | nindent 4 | trim }}
  {{- end }}
{{- end }}
{{- end }}

{{/* The container's extraEnvFrom and extraEnv; env comes after the chart's own. */}}
{{- define "idemd.extraEnv" -}}
{{- with .s.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The container's volumeMounts: the chart's own (.mounts) and extraVolumeMounts. */}}
{{- define "idemd.volumeMounts" -}}
{{- $all := concat (.mounts | default list) (.s.extraVolumeMounts | default list) }}
{{- with $all }}
volumeMounts:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pod's volumes: the chart's own (.volumes) and extraVolumes. */}}
{{- define "idemd.volumes" -}}
{{- $all := concat (.volumes | default list) (.s.extraVolumes | default list) }}
{{- with $all }}
volumes:
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

{{/* Pod annotations: a checksum of the ConfigMaps the pod reads, so a change
rolls it as kustomize's name hash does (the migration reads none), and podAnnotations (global and the component's). */}}
{{- define "idemd.podAnnotations" -}}
{{- $a := deepCopy .s.podAnnotations }}
{{- if ne .name "migrate" }}
{{- $_ := set $a "checksum/config" (dict "common" .root.Values.common.config "own" .config | toJson | sha256sum) }}
{{- end }}
{{- with $a }}
{{- toYaml . }}
{{- end }}
{{- end }}
