{{/*
idemd.checkSchedule fails the render when reaper.schedule is not a
schedule the reaper's and Kubernetes' cron parser accepts: robfig/cron v3
with the five standard fields and the descriptors (cron.ParseStandard,
which the CronJob controller uses, and the reaper's --schedule parser:
internal/reaper/config.go). It follows the parser step by step (fields
split on white space, each a comma-separated list of ranges, a range
N, N-M, * or ? with an optional /step, names for months and weekdays,
@every with a Go duration), and deploy/helm/schedule_test.go checks it
against the parser itself on every form of spec. A time zone in the
schedule (TZ=, CRON_TZ=) is refused: Kubernetes refuses it beside
spec.timeZone, which reaper.timeZone sets.
*/}}
{{- define "idemd.checkSchedule" -}}
{{- $spec := . -}}
{{- $st := dict "err" "" -}}
{{- if not $spec -}}
{{- $_ := set $st "err" "it is empty" -}}
{{- else if or (hasPrefix "TZ=" $spec) (hasPrefix "CRON_TZ=" $spec) -}}
{{- $_ := set $st "err" "a time zone in the schedule is refused beside the CronJob's timeZone: set reaper.timeZone" -}}
{{- else if hasPrefix "@" $spec -}}
{{- if has $spec (list "@yearly" "@annually" "@monthly" "@weekly" "@daily" "@midnight" "@hourly") -}}
{{- else if hasPrefix "@every " $spec -}}
{{- /* time.ParseDuration's grammar: a signed sequence of decimal numbers with units, or 0. */ -}}
{{- if not (regexMatch "^[-+]?(0|(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$" (trimPrefix "@every " $spec)) -}}
{{- $_ := set $st "err" (printf "%q is not a Go duration (90s, 15m, 1h30m)" (trimPrefix "@every " $spec)) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $st "err" "unrecognized descriptor (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, @every <duration>)" -}}
{{- end -}}
{{- else -}}
{{- /* strings.Fields: unicode.IsSpace's characters. */ -}}
{{- $space := "[\\t\\n\\v\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]+" -}}
{{- $trimmed := regexReplaceAll (printf "^%s|%s$" $space $space) $spec "" -}}
{{- $fields := list -}}
{{- if $trimmed -}}
{{- $fields = regexSplit $space $trimmed -1 -}}
{{- end -}}
{{- if ne (len $fields) 5 -}}
{{- $_ := set $st "err" (printf "expected exactly 5 fields (minute hour day-of-month month day-of-week), found %d" (len $fields)) -}}
{{- else -}}
{{- $months := dict "jan" 1 "feb" 2 "mar" 3 "apr" 4 "may" 5 "jun" 6 "jul" 7 "aug" 8 "sep" 9 "oct" 10 "nov" 11 "dec" 12 -}}
{{- $days := dict "sun" 0 "mon" 1 "tue" 2 "wed" 3 "thu" 4 "fri" 5 "sat" 6 -}}
{{- $bounds := list (dict "name" "minute" "min" 0 "max" 59) (dict "name" "hour" "min" 0 "max" 23) (dict "name" "day of month" "min" 1 "max" 31) (dict "name" "month" "min" 1 "max" 12 "names" $months) (dict "name" "day of week" "min" 0 "max" 6 "names" $days) -}}
{{- range $i, $field := $fields -}}
{{- $b := index $bounds $i -}}
{{- range $expr := splitList "," $field -}}
{{- if and $expr (not $st.err) -}}
{{- $rs := splitList "/" $expr -}}
{{- $lh := splitList "-" (first $rs) -}}
{{- $r := dict "start" 0 "end" 0 "step" 1 -}}
{{- if or (eq (first $lh) "*") (eq (first $lh) "?") -}}
{{- $_ := set $r "start" $b.min -}}
{{- $_ := set $r "end" $b.max -}}
{{- else if gt (len $lh) 2 -}}
{{- $_ := set $st "err" (printf "too many hyphens in %q" $expr) -}}
{{- else -}}
{{- range $j, $n := $lh -}}
{{- $v := include "idemd.cronInt" (dict "s" $n "names" $b.names) -}}
{{- if hasPrefix "!" $v -}}
{{- if not $st.err }}{{ $_ := set $st "err" (printf "%s in %q" (trimPrefix "!" $v) $expr) }}{{ end -}}
{{- else -}}
{{- if eq $j 0 }}{{ $_ := set $r "start" (atoi $v) }}{{ end -}}
{{- $_ := set $r "end" (atoi $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (len $rs) 2 -}}
{{- if not $st.err }}{{ $_ := set $st "err" (printf "too many slashes in %q" $expr) }}{{ end -}}
{{- else if eq (len $rs) 2 -}}
{{- $v := include "idemd.cronInt" (dict "s" (last $rs)) -}}
{{- if hasPrefix "!" $v -}}
{{- if not $st.err }}{{ $_ := set $st "err" (printf "%s in %q" (trimPrefix "!" $v) $expr) }}{{ end -}}
{{- else -}}
{{- $_ := set $r "step" (atoi $v) -}}
{{- if eq (len $lh) 1 }}{{ $_ := set $r "end" $b.max }}{{ end -}}
{{- end -}}
{{- end -}}
{{- if not $st.err -}}
{{- if lt (int $r.start) (int $b.min) -}}
{{- $_ := set $st "err" (printf "%q starts below the %s's minimum %d" $expr $b.name (int $b.min)) -}}
{{- else if gt (int $r.end) (int $b.max) -}}
{{- $_ := set $st "err" (printf "%q ends above the %s's maximum %d" $expr $b.name (int $b.max)) -}}
{{- else if gt (int $r.start) (int $r.end) -}}
{{- $_ := set $st "err" (printf "%q starts after it ends" $expr) -}}
{{- else if eq (int $r.step) 0 -}}
{{- $_ := set $st "err" (printf "%q has a step of 0" $expr) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $st.err -}}
{{- fail (printf "reaper.schedule %q is not a cron schedule the reaper and Kubernetes accept: %s. Examples: \"17 * * * *\", \"@hourly\", \"@every 1h\"" $spec .) -}}
{{- end -}}
{{- end }}

{{/*
idemd.cronInt is one number of a cron range as robfig/cron reads it (a
name of .names, case-insensitive, or strconv.Atoi's decimal): its value,
9999 for any value above every field's maximum, or "!" and why not.
*/}}
{{- define "idemd.cronInt" -}}
{{- $s := .s -}}
{{- if and .names (hasKey .names (lower $s)) -}}
{{- index .names (lower $s) -}}
{{- else if not (regexMatch "^[-+]?[0-9]+$" $s) -}}
!{{ printf "%q is not a number" $s }}
{{- else -}}
{{- $digits := regexReplaceAll "^[-+]?0*" $s "" -}}
{{- if or (gt (len $digits) 19) (and (eq (len $digits) 19) (gt $digits "9223372036854775807")) -}}
!{{ printf "%q is out of range" $s }}
{{- else if and (hasPrefix "-" $s) $digits -}}
!{{ printf "%q is negative" $s }}
{{- else if gt (len $digits) 3 -}}
9999
{{- else -}}
{{- atoi (printf "0%s" $digits) -}}
{{- end -}}
{{- end -}}
{{- end }}
