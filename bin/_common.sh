# Shared by the bin/ wrappers (sourced): how to call asyncrl, one-line errors, background roles.
# ASYNCRL overrides the command (e.g. ASYNCRL="python -m asyncrl"); else the repository's .venv,
# else `asyncrl` on PATH.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${ASYNCRL:-}" ]]; then
    read -r -a ASYNCRL_CMD <<< "$ASYNCRL"
elif [[ -x "$_root/.venv/bin/asyncrl" ]]; then
    ASYNCRL_CMD=("$_root/.venv/bin/asyncrl")
else
    ASYNCRL_CMD=(asyncrl)
fi

die() {   # one line on stderr, exit status 2 (like asyncrl's own argument errors)
    echo "$PROG: $*" >&2
    exit 2
}

need_value() {   # need_value OPTION NEXT-ARG
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value (see --help)"
}

is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_port() { [[ "$1" =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= 65533 )); }

show() { printf '%q ' "$@"; printf '\n'; }   # a command line as it would be typed

BG_PIDS=()
stop_background() {   # SIGTERM to the roles this script started (by pid), then wait for them
    # (not SIGINT: a job started with & in a script begins with SIGINT ignored, and keeps it so)
    local pid
    for pid in "${BG_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${BG_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
