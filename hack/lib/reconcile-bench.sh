# Sourced by the tools around the reconcile bench (hack/trace-reconcile.sh,
# hack/profile-reconcile.sh). remember_started LINE reads one of the
# bench's "started ... (pid N)" lines into the caller's associative array
# `pid` under kplug, plugin or relay; with KPLUG_BASELINE set, the baseline
# build and its own plugin start after this build's, as baseline and
# baseline-plugin. Fails for any other line.
remember_started() {
    local line=$1 role
    case "$line" in
        "started kplug-apiserver (pid "*)
            if [[ -v pid[kplug] ]]; then role=baseline; else role=kplug; fi ;;
        "started hello-plugin (pid "*)
            if [[ -v pid[plugin] ]]; then role=baseline-plugin; else role=plugin; fi ;;
        "started the relay (pid "*) role=relay ;;
        *) return 1 ;;
    esac
    pid[$role]=$(grep -o '[0-9]*' <<<"${line#*pid }" | head -1)
}
