# Shared by bin/run, bin/test and the benchmark scripts: install what is
# missing, find the repository, build the binaries.
# shellcheck shell=bash

MAAS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export MAAS_ROOT

say() { printf '%s\n' "$*" >&2; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        say "need root to run: $*  (no sudo here; install it by hand)"
        return 1
    fi
}

have_pg_server() {
    local bindir
    bindir=$(pg_config --bindir 2>/dev/null || true)
    [[ -n $bindir && -x $bindir/initdb && -x $bindir/postgres ]] && return 0
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

# Installs the PostgreSQL server (and psql) with apt-get when missing.
ensure_postgres() {
    if have_pg_server && command -v psql >/dev/null 2>&1; then
        return 0
    fi
    say "PostgreSQL is not installed; installing it with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib >/dev/null
    have_pg_server || { say "PostgreSQL server binaries still missing after apt-get"; return 1; }
}

# Installs promtool (Debian's `prometheus` package) when missing, for the
# alert rules' tests. Returns 1, with a message, where it cannot be
# installed (no root, no apt-get): the caller skips those tests then.
# (The package also installs a Prometheus server; the tests do not use it.)
ensure_promtool() {
    command -v promtool >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || { say "promtool missing and no apt-get to install it"; return 1; }
    say "promtool is not installed; installing Debian's prometheus package with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null ||
        return 1
    command -v promtool >/dev/null 2>&1
}

# Installs PgBouncer (the distribution's `pgbouncer` package) when missing,
# for the pooler test (tests/it/pooler.rs). Returns 1, with a message,
# where it cannot be installed: that test skips then.
have_pgbouncer() {
    command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]
}

ensure_pgbouncer() {
    have_pgbouncer && return 0
    command -v apt-get >/dev/null 2>&1 || { say "pgbouncer missing and no apt-get to install it"; return 1; }
    say "pgbouncer is not installed; installing the distribution's pgbouncer package with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null ||
        return 1
    have_pgbouncer
}

ensure_cargo() {
    if ! command -v cargo >/dev/null 2>&1; then
        # shellcheck disable=SC1091
        [[ -f $HOME/.cargo/env ]] && . "$HOME/.cargo/env"
    fi
    command -v cargo >/dev/null 2>&1 || { say "cargo not found: install Rust (https://rustup.rs)"; return 1; }
}

# Installs headless Chromium and its WebDriver (Debian's `chromium` and
# `chromium-driver`) when missing, for the console's browser tests.
# Returns 1, with a message, where they cannot be installed: those tests
# skip then.
ensure_chromium() {
    command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || { say "chromium missing and no apt-get to install it"; return 1; }
    say "chromium is not installed; installing Debian's chromium and chromium-driver with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null ||
        return 1
    command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1
}
