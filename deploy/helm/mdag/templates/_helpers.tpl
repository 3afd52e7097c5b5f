{{/*
mdag.image: the image reference of images.<key> (dict "root" $ "key" KEY):
repository@digest when the digest is set, else repository:tag; a tag latest
or empty with no digest fails (a pod restarted later could pull another
build than its neighbours).
*/}}
{{- define "mdag.image" -}}
{{- $im := index .root.Values.images .key -}}
{{- if not $im -}}
{{- fail (printf "images.%s: no such image (want mdag, lean or torchRunner)" .key) -}}
{{- end -}}
{{- if $im.digest -}}
{{- printf "%s@%s" $im.repository $im.digest -}}
{{- else if eq ($im.tag | toString) "latest" -}}
{{- fail (printf "images.%s.tag is latest: pin a build (another tag, or images.%s.digest)" .key .key) -}}
{{- else if not $im.tag -}}
{{- fail (printf "images.%s: no tag and no digest: pin a build (images.%s.tag or images.%s.digest)" .key .key .key) -}}
{{- else -}}
{{- printf "%s:%s" $im.repository ($im.tag | toString) -}}
{{- end -}}
{{- end -}}

{{/* mdag.workerImage: images key of a worker type's image (mdag or lean). */}}
{{- define "mdag.workerImageKey" -}}
{{- $image := .worker.image | default "mdag" -}}
{{- if not (has $image (list "mdag" "lean")) -}}
{{- fail (printf "workers.%s.image: %q, want mdag or lean" .name $image) -}}
{{- end -}}
{{- $image -}}
{{- end -}}

{{/* mdag.podSecurity: the pod securityContext of every mdag pod (restricted). */}}
{{- define "mdag.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* mdag.containerSecurityContext: every container's (restricted). */}}
{{- define "mdag.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* mdag.labels: the labels every object of component NAME carries. */}}
{{- define "mdag.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: mdag
{{- end -}}

{{/* mdag.file: a value's text if set, else the chart's file. */}}
{{- define "mdag.file" -}}
{{- if .value -}}{{ .value }}{{- else -}}{{ .root.Files.Get .file }}{{- end -}}
{{- end -}}
