{{/* Names ------------------------------------------------------------------------ */}}

{{- define "kembed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-kembed, or the release name when it already holds the chart's name. */}}
{{- define "kembed.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of one role's resources: (dict "root" $ "role" "worker"). */}}
{{- define "kembed.roleName" -}}
{{- printf "%s-%s" (include "kembed.fullname" .root) .role -}}
{{- end -}}

{{/* Labels -------------------------------------------------------------------------- */}}

{{- define "kembed.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kembed
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A role's selector labels. app.kubernetes.io/name is kembed-<role>: the Prometheus
job name that deploy/prometheus/rules.yml and the dashboard expect. */}}
{{- define "kembed.selectorLabels" -}}
app.kubernetes.io/name: kembed-{{ .role }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "kembed.labels" -}}
{{ include "kembed.commonLabels" .root }}
{{ include "kembed.selectorLabels" . }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{/* Images ------------------------------------------------------------------------ */}}

{{- define "kembed.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion (toString .image.tag)) -}}
{{- end -}}

{{/* Kafka: secrets and environment -------------------------------------------------- */}}

{{- define "kembed.sasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol -}}true{{- end -}}
{{- end -}}

{{- define "kembed.tls" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the SASL password: the chart's, or kafka.sasl.existingSecret. */}}
{{- define "kembed.kafkaSecretName" -}}
{{- default (printf "%s-kafka" (include "kembed.fullname" .)) .Values.kafka.sasl.existingSecret -}}
{{- end -}}

{{- define "kembed.kafkaSecretKey" -}}
{{- if .Values.kafka.sasl.existingSecret -}}
{{- .Values.kafka.sasl.existingSecretPasswordKey -}}
{{- else -}}
password
{{- end -}}
{{- end -}}

{{/* Checks of the Kafka values, failing the render with a message naming the value. */}}
{{- define "kembed.validateKafka" -}}
{{- $k := .Values.kafka -}}
{{- if include "kembed.sasl" . -}}
{{- if not $k.sasl.mechanism -}}
{{- fail (printf "kafka.sasl.mechanism is required with kafka.securityProtocol %s (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)" $k.securityProtocol) -}}
{{- end -}}
{{- if not $k.sasl.username -}}
{{- fail (printf "kafka.sasl.username is required with kafka.securityProtocol %s" $k.securityProtocol) -}}
{{- end -}}
{{- if and (not $k.sasl.password) (not $k.sasl.existingSecret) -}}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.password or kafka.sasl.existingSecret" $k.securityProtocol) -}}
{{- end -}}
{{- end -}}
{{- if and $k.sasl.password $k.sasl.existingSecret -}}
{{- fail "set kafka.sasl.password or kafka.sasl.existingSecret, not both" -}}
{{- end -}}
{{- if and $k.tls.caSecret $k.tls.caConfigMap -}}
{{- fail "set kafka.tls.caSecret or kafka.tls.caConfigMap, not both" -}}
{{- end -}}
{{- if and (or $k.tls.caSecret $k.tls.caConfigMap) (not (include "kembed.tls" .)) -}}
{{- fail (printf "kafka.tls.caSecret/caConfigMap are for kafka.securityProtocol SSL or SASL_SSL, not %s" $k.securityProtocol) -}}
{{- end -}}
{{- end -}}

{{- define "kembed.caMountPath" -}}/etc/kembed/kafka-ca{{- end -}}

{{/* KEMBED_BOOTSTRAP_SERVERS and the security settings, read by every kembed command.
(dict "root" $ "secret" <Secret holding the SASL password> "key" <its key>) */}}
{{- define "kembed.kafkaEnv" -}}
{{- $root := .root -}}
{{- $k := $root.Values.kafka -}}
- name: KEMBED_BOOTSTRAP_SERVERS
  value: {{ required "kafka.bootstrapServers is required" $k.bootstrapServers | quote }}
- name: KEMBED_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if include "kembed.sasl" $root }}
- name: KEMBED_SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: KEMBED_SASL_USERNAME
  value: {{ $k.sasl.username | quote }}
- name: KEMBED_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
{{- end }}
{{- if or $k.tls.caSecret $k.tls.caConfigMap }}
- name: KEMBED_SSL_CAFILE
  value: {{ printf "%s/%s" (include "kembed.caMountPath" $root) $k.tls.caKey | quote }}
{{- end }}
{{- if and (include "kembed.tls" $root) (not $k.tls.checkHostname) }}
- name: KEMBED_SSL_CHECK_HOSTNAME
  value: "false"
{{- end }}
{{- end -}}

{{/* The CA volume and its mount, when a CA is given. */}}
{{- define "kembed.caVolume" -}}
{{- $k := .Values.kafka -}}
{{- if $k.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $k.tls.caSecret }}
    items:
      - key: {{ $k.tls.caKey }}
        path: {{ $k.tls.caKey }}
{{- else if $k.tls.caConfigMap }}
- name: kafka-ca
  configMap:
    name: {{ $k.tls.caConfigMap }}
    items:
      - key: {{ $k.tls.caKey }}
        path: {{ $k.tls.caKey }}
{{- end }}
{{- end -}}

{{- define "kembed.caVolumeMount" -}}
{{- if or .Values.kafka.tls.caSecret .Values.kafka.tls.caConfigMap }}
- name: kafka-ca
  mountPath: {{ include "kembed.caMountPath" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The workers' topic settings; the topics Job reads the same ones. */}}
{{- define "kembed.topicEnv" -}}
{{- $t := .Values.topics -}}
- name: KEMBED_REQUESTS_TOPIC
  value: {{ $t.requests | quote }}
- name: KEMBED_BULK_TOPIC
  value: {{ $t.bulk | quote }}
- name: KEMBED_RESULTS_TOPIC
  value: {{ $t.results | quote }}
- name: KEMBED_DLQ_TOPIC
  value: {{ $t.dlq | quote }}
- name: KEMBED_CATALOG_TOPIC
  value: {{ $t.catalog | quote }}
- name: KEMBED_MAX_REQUEST_BYTES
  value: {{ $t.maxRequestBytes | int64 | quote }}
- name: KEMBED_MAX_RESULT_BYTES
  value: {{ $t.maxResultBytes | int64 | quote }}
{{- end -}}

{{/* Pods ----------------------------------------------------------------------------- */}}

{{- define "kembed.podSecurity" -}}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* A probe: (dict "path" "/ready" "probe" <values> ) on the port named http. */}}
{{- define "kembed.probe" -}}
httpGet:
  path: {{ .path }}
  port: http
periodSeconds: {{ .probe.periodSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
{{- end -}}

{{/* The termination grace period of a role: the explicit value, which must exceed
`floor`, or floor + margin. (dict "value" <set value or nil> "floor" <seconds> "margin"
<seconds> "what" <the value's name> "floorName" <the floor's value name>) */}}
{{- define "kembed.gracePeriod" -}}
{{- if kindIs "invalid" .value -}}
{{- add (int .floor) (int .margin) -}}
{{- else if le (int .value) (int .floor) -}}
{{- fail (printf "%s (%d) must exceed %s (%d): a pod killed before its in-flight requests finish leaves them to be redelivered" .what (int .value) .floorName (int .floor)) -}}
{{- else -}}
{{- int .value -}}
{{- end -}}
{{- end -}}
