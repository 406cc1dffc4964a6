"""Static checks of docker/: the compose file, the image, the Dagster instance.

There is no Docker engine where the tests run, so nothing is built or started:
the files are parsed and checked against each other, against the repository
(COPY sources) and, when dagster is importable, against Dagster's own instance
config schema. The checks live in helpers that return a list of problems, so
the negative tests can show that each check does fail on a broken input.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
DAGSTER_YAML = DOCKER / "dagster.yaml"
WORKSPACE_YAML = DOCKER / "workspace.yaml"
ENV_EXAMPLE = DOCKER / ".env.example"
README = DOCKER / "README.md"
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"

EXPECTED_SERVICES = {
    "minio",
    "minio-init",
    "postgres",
    "spark-master",
    "spark-worker",
    "spark-connect",
    "code-location",
    "webserver",
    "daemon",
}
DAGSTER_SERVICES = ("code-location", "webserver", "daemon")
# service -> container ports that must be published on the host
REQUIRED_PORTS = {"minio": {9000}, "webserver": {3000}, "spark-master": {7077}}
# service -> container path that must be backed by a named volume
REQUIRED_VOLUMES = {"minio": "/data", "postgres": "/var/lib/postgresql/data"}
# environment every Dagster service gets (DESIGN.md §4); None = any value
DAGSTER_ENV = {
    "WIRE_S3_ENDPOINT": "http://minio:9000",
    "WIRE_S3_ACCESS_KEY": None,
    "WIRE_S3_SECRET_KEY": None,
    "WIRE_S3_BUCKET": None,
    "WIRE_SPARK_MASTER": "spark://spark-master:7077",
    "WIRE_PIPELINES": "/opt/wire/pipelines",
    "DAGSTER_HOME": "/opt/dagster/home",
    "DAGSTER_PG_HOST": "postgres",
    "DAGSTER_PG_PORT": None,
    "DAGSTER_PG_USER": None,
    "DAGSTER_PG_PASSWORD": None,
    "DAGSTER_PG_DB": None,
}
TAG_LIMIT = {"key": "wire/pipeline", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
# What the build context (the repository root) must leave out: ~2 GB of .venv, local state,
# version control, caches, test output, and docker/.env with the stack's secrets.
MUST_IGNORE = (
    ".venv/bin/python",
    ".wire/s3/data",
    ".git/HEAD",
    "test-artifacts/browser.png",
    "wire_dagster/__pycache__/spec.cpython-311.pyc",
    ".pytest_cache/v/cache",
    ".ruff_cache/CACHEDIR.TAG",
    ".hypothesis/examples/x",
    "wire_dagster.egg-info/PKG-INFO",
    "docker/.env",
)

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?msg}, ${VAR?msg}, ${VAR:+alt};
# `$${...}` is compose's escape for a literal `${...}` and is not a variable.
VAR_RE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.I)
# environment keys that carry a credential even though the name does not say so
SECRET_ENV_KEYS = {"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "POSTGRES_PASSWORD"}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def compose_text() -> str:
    return COMPOSE_FILE.read_text()


def load_compose() -> dict:
    return yaml.safe_load(compose_text())


def compose_variables(text: str) -> dict[str, list[tuple[str, str]]]:
    """Variable name -> [(operator, argument)] of every `${...}` in text.

    The operator is "" for a bare `${VAR}`, else one of `:-`, `-`, `:?`, `?`, `:+`, `+`.
    """
    found: dict[str, list[tuple[str, str]]] = {}
    for match in VAR_RE.finditer(text):
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        found.setdefault(name, []).append((op, arg))
    return found


def variables_in(node: object) -> dict[str, list[tuple[str, str]]]:
    """compose_variables() over every key and string value of a parsed compose
    file: what compose interpolates (YAML comments are not)."""
    found: dict[str, list[tuple[str, str]]] = {}

    def walk(item: object) -> None:
        if isinstance(item, dict):
            for key, value in item.items():
                walk(key)
                walk(value)
        elif isinstance(item, list):
            for value in item:
                walk(value)
        elif isinstance(item, str):
            for name, uses in compose_variables(item).items():
                found.setdefault(name, []).extend(uses)

    walk(node)
    return found


def env_of(service: dict) -> dict[str, str | None]:
    """A service's environment, from either the mapping or the list form."""
    env = service.get("environment") or {}
    if isinstance(env, dict):
        return {str(k): (None if v is None else str(v)) for k, v in env.items()}
    out: dict[str, str | None] = {}
    for item in env:
        key, sep, value = str(item).partition("=")
        out[key] = value if sep else None
    return out


def published_container_ports(service: dict) -> set[int]:
    """Container ports that a service publishes on the host."""
    ports: set[int] = set()
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            if entry.get("published") not in (None, ""):
                ports.add(int(entry["target"]))
            continue
        spec = str(entry).split("/")[0]  # drop /tcp, /udp
        parts = spec.rsplit(":", 2)
        if len(parts) >= 2:  # [ip:]host:container; a lone port is not published
            ports.add(int(parts[-1]))
    return ports


def volume_mounts(service: dict) -> list[tuple[str | None, str, str]]:
    """(source, target, type) of each volume of a service."""
    mounts = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts.append((entry.get("source"), entry["target"], entry.get("type", "volume")))
            continue
        parts = str(entry).split(":")
        if len(parts) == 1:
            mounts.append((None, parts[0], "volume"))  # anonymous volume
            continue
        source, target = parts[0], parts[1]
        is_bind = source.startswith((".", "/", "~", "$"))
        mounts.append((source, target, "bind" if is_bind else "volume"))
    return mounts


def depends_on_names(service: dict) -> list[str]:
    deps = service.get("depends_on") or []
    return list(deps.keys()) if isinstance(deps, dict) else [str(d) for d in deps]


def is_required_reference(value: str | None) -> bool:
    """True when value is exactly one `${VAR:?message}` and nothing else."""
    if value is None:
        return False
    match = VAR_RE.fullmatch(value.strip())
    return bool(match) and match.group(2) == ":?"


def compose_problems(compose: dict) -> list[str]:
    """Everything wrong with a parsed compose file."""
    problems: list[str] = []
    services: dict = compose.get("services") or {}

    for name in sorted(EXPECTED_SERVICES - set(services)):
        problems.append(f"missing service {name!r}")

    for name, ports in REQUIRED_PORTS.items():
        if name in services:
            missing = ports - published_container_ports(services[name])
            if missing:
                problems.append(f"service {name!r} does not publish port(s) {sorted(missing)}")

    declared = set((compose.get("volumes") or {}).keys())
    used: set[str] = set()
    for name, service in services.items():
        for source, _target, kind in volume_mounts(service):
            if kind == "volume" and source:
                used.add(source)
                if source not in declared:
                    problems.append(f"service {name!r} uses undeclared volume {source!r}")
    for volume in sorted(declared - used):
        problems.append(f"named volume {volume!r} is declared but no service uses it")
    for name, target in REQUIRED_VOLUMES.items():
        if name in services:
            ok = any(
                kind == "volume" and source in declared and mount_target == target
                for source, mount_target, kind in volume_mounts(services[name])
            )
            if not ok:
                problems.append(f"service {name!r} keeps {target} outside a named volume")

    for name, service in services.items():
        for dep in depends_on_names(service):
            if dep not in services:
                problems.append(f"service {name!r} depends on unknown service {dep!r}")
            elif "profiles" in services[dep] and "profiles" not in service:
                problems.append(f"service {name!r} depends on {dep!r}, which only runs in a profile")

    for var, uses in variables_in(compose).items():
        if SECRET_NAME.search(var):
            for op, arg in uses:
                if op != ":?":
                    shown = "${" + var + op + arg + "}"
                    problems.append(f"secret {shown} must be required (${{{var}:?...}}), with no default")

    for name, service in services.items():
        for key, value in env_of(service).items():
            if (SECRET_NAME.search(key) or key in SECRET_ENV_KEYS) and not is_required_reference(value):
                problems.append(f"service {name!r}: {key} must be a required ${{VAR:?...}} reference, not {value!r}")

    for name in DAGSTER_SERVICES:
        if name not in services:
            continue
        env = env_of(services[name])
        for key, expected in DAGSTER_ENV.items():
            if key not in env:
                problems.append(f"service {name!r} lacks {key} in its environment")
            elif expected is not None and env[key] != expected:
                problems.append(f"service {name!r}: {key}={env[key]!r}, expected {expected!r}")

    return list(dict.fromkeys(problems))  # merged `x-` blocks repeat the same finding


def project_image_services(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if "build" in s}


def build_context(service: dict) -> tuple[Path, Path]:
    """(context directory, Dockerfile path) of a service built from this repo."""
    build = service["build"]
    if isinstance(build, str):
        build = {"context": build}
    context = (COMPOSE_FILE.parent / build.get("context", ".")).resolve()
    return context, context / build.get("dockerfile", "Dockerfile")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            word, _, rest = full.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    if pending.strip():
        word, _, rest = pending.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def copy_args(args: str) -> tuple[dict[str, str], list[str], str]:
    """(flags, sources, destination) of a COPY/ADD instruction (shell or JSON form)."""
    flags: dict[str, str] = {}
    rest = args.strip()
    while match := re.match(r"--([A-Za-z-]+)(?:=(\S*))?\s+", rest):
        flags[match.group(1)] = match.group(2) or ""
        rest = rest[match.end() :]
    tokens = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    return flags, tokens[:-1], tokens[-1]


def dockerfile_env(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in instructions:
        if word != "ENV":
            continue
        tokens = shlex.split(args)
        if len(tokens) >= 2 and "=" not in tokens[0]:  # legacy `ENV KEY value`
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            env[key] = value
    return env


def dockerfile_problems(text: str, context: Path) -> list[str]:
    """What is wrong with a Dockerfile built from `context` (the repository root)."""
    problems: list[str] = []
    instructions = dockerfile_instructions(text)
    froms = [args for word, args in instructions if word == "FROM"]
    if not froms or not froms[0].split()[0].startswith("python:3.11"):
        problems.append(f"base image is {froms[:1]}, expected python:3.11-*")

    for word, args in instructions:
        if word not in ("COPY", "ADD"):
            continue
        flags, sources, _dest = copy_args(args)
        if "from" in flags:
            continue  # from another stage or image, not the context
        for source in sources:
            if re.match(r"^[a-z]+://", source):
                continue
            path = context / source
            if any(ch in source for ch in "*?["):
                if not list(context.glob(source)):
                    problems.append(f"{word} {source}: matches nothing in the build context")
            elif not path.exists():
                problems.append(f"{word} {source}: not in the build context {context}")
            elif not path.resolve().is_relative_to(context.resolve()):
                problems.append(f"{word} {source}: outside the build context")

    runs = " ".join(args for word, args in instructions if word == "RUN")
    if not re.search(r"\bopenjdk-17-jre(-headless)?\b", runs):
        problems.append("Java 17 (openjdk-17-jre-headless) is not installed")
    if not re.search(r"pip install[^&;]*\s\.(\s|$|\[)", runs + " "):
        problems.append("the project is not installed with `pip install .`")

    env = dockerfile_env(instructions)
    if not env.get("PYSPARK_PYTHON", "").endswith(("/python", "/python3", "/python3.11")):
        problems.append(f"PYSPARK_PYTHON is {env.get('PYSPARK_PYTHON')!r}, not the image's python")
    return problems


def env_example_entries(text: str) -> dict[str, tuple[str, list[str]]]:
    """Variable -> (value, the comment lines right above it) in a .env file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    comments: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            comments.append(line.lstrip("#").strip())
            continue
        if not line:
            comments = []
            continue
        key, sep, value = line.partition("=")
        assert sep, f".env.example line is not NAME=value: {raw!r}"
        entries[key.strip()] = (value.strip(), comments)
        comments = []
    return entries


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception `!`, regex) of each line of a .dockerignore, in order. Docker's rules: a
    `#` starts a comment only at the start of a line, a leading `/` is dropped, `*` and `?` stay
    within one path element, `**` spans any number of them."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = str(PurePosixPath(pattern.lstrip("/")))
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[" and "]" in pattern[i:]:
                j = pattern.index("]", i)
                out, i = out + pattern[i : j + 1], j + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        patterns.append((negate, re.compile(out + r"\Z")))
    return patterns


def dockerignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """True if `path` (relative to the build context) stays out of the context: the last pattern
    matching it or one of its parent directories decides."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    ignored = False
    for negate, regex in patterns:
        if any(regex.match(c) for c in candidates):
            ignored = not negate
    return ignored


def dockerignore_problems(text: str, context: Path, copied: list[str]) -> list[str]:
    """What is wrong with the build context's .dockerignore `text`: something heavy or secret
    kept in the context, or a file the Dockerfile COPYs (`copied`, context-relative) left out."""
    patterns = dockerignore_patterns(text)
    problems = [
        f"{path} is not excluded from the build context" for path in MUST_IGNORE if not dockerignored(path, patterns)
    ]
    for source in copied:
        bases = list(context.glob(source)) if any(ch in source for ch in "*?[") else [context / source]
        files = [f for b in bases for f in ([b] if b.is_file() else b.rglob("*")) if f.is_file()]
        for f in files:
            rel = f.relative_to(context).as_posix()
            if "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo")):
                continue
            if dockerignored(rel, patterns):
                problems.append(f"COPY {source}: {rel} is excluded by .dockerignore")
    return problems


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a RUN's shell script (split at `&&`, `||`, `;`, `|` outside quotes)."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", ";", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def pip_installs(instructions: list[tuple[str, str]]) -> list[tuple[int, list[str], str]]:
    """(instruction index, arguments after `pip install`, the whole RUN) of every pip install
    (`pip`, `pip3`, `python -m pip`)."""
    found = []
    for index, (word, args) in enumerate(instructions):
        if word != "RUN":
            continue
        for tokens in shell_commands(args):
            for i, token in enumerate(tokens[:-1]):
                if token in ("pip", "pip3") and tokens[i + 1] == "install":
                    found.append((index, tokens[i + 2 :], args))
                    break
    return found


def install_problems(text: str, packages: list[str], modules: list[str]) -> list[str]:
    """Whether the Dockerfile installs every version from requirements.lock (pip constraints, the
    lock COPYed first) and whether every package and module pyproject.toml names exists (COPYed
    or a stand-in created in the same RUN) when the project itself is installed."""
    problems: list[str] = []
    instructions = dockerfile_instructions(text)
    copied_at: dict[str, int] = {}
    for index, (word, args) in enumerate(instructions):
        if word == "COPY":
            flags, sources, _dest = copy_args(args)
            if "from" not in flags:
                for source in sources:
                    copied_at.setdefault(source.rstrip("/"), index)
                    if any(ch in source for ch in "*?["):  # `pkg/*.py` brings the package directory
                        copied_at.setdefault(re.split(r"/[^/]*[*?[]", source)[0], index)
    installs = pip_installs(instructions)
    if not installs:
        problems.append("no pip install at all")
    for index, args, run in installs:
        shown = "pip install " + " ".join(args)
        if "--no-deps" not in args:
            constrained = any(
                (a in ("-c", "--constraint") and args[i + 1 : i + 2] == ["requirements.lock"])
                or a in ("-c=requirements.lock", "--constraint=requirements.lock", "-crequirements.lock")
                for i, a in enumerate(args)
            )
            if not constrained:
                problems.append(f"`{shown}` does not install from requirements.lock (-c requirements.lock)")
            elif copied_at.get("requirements.lock", len(instructions)) > index:
                problems.append(f"`{shown}`: requirements.lock is not COPYed before it")
        if "." in args or "./" in args:
            wanted = [(p, f"{p}/__init__.py") for p in packages] + [(f"{m}.py", f"{m}.py") for m in modules]
            for name, stand_in in wanted:
                if copied_at.get(name, len(instructions)) > index and not re.search(
                    rf"(?<![\w/]){re.escape(stand_in)}(?![\w/])", run
                ):
                    problems.append(f"`{shown}`: {name} is neither COPYed before it nor a stand-in in its RUN")
    return problems


def interpolate_unset(value: str) -> str:
    """`value` as compose interpolates it with none of its variables set (their defaults)."""
    return VAR_RE.sub(lambda m: m.group(3) or "" if m.group(2) in ("-", ":-") else "", value)


def spark_connect_problems(compose: dict) -> list[str]:
    """Whether the runs attach to the stack's Spark Connect server by default: WIRE_SPARK_REMOTE of
    the Dagster services defaults to sc://<service>:<port> of a service that always runs (no
    profile) and serves Spark Connect on that port, and the code location (where the runs start)
    waits for it."""
    problems: list[str] = []
    services: dict = compose.get("services") or {}
    for name in DAGSTER_SERVICES:
        if name not in services:
            continue
        raw = env_of(services[name]).get("WIRE_SPARK_REMOTE")
        url = interpolate_unset(raw or "")
        match = re.fullmatch(r"sc://([A-Za-z0-9_.-]+):(\d+)", url)
        if not match:
            problems.append(f"service {name!r}: WIRE_SPARK_REMOTE defaults to {url!r}, not a Spark Connect URL")
            continue
        host, port = match.group(1), match.group(2)
        server = services.get(host)
        if server is None:
            problems.append(f"service {name!r}: WIRE_SPARK_REMOTE names {host!r}, which is not a service")
            continue
        if "profiles" in server:
            problems.append(f"service {host!r} only runs in profile(s) {server['profiles']}: not a default")
        command = " ".join(map(str, server.get("command") or []))
        if "start-connect-server" not in command:
            problems.append(f"service {host!r} does not start a Spark Connect server")
        if f"spark.connect.grpc.binding.port={port}" not in command:
            problems.append(f"service {host!r} does not serve Spark Connect on port {port}")
        if name == "code-location" and host not in depends_on_names(services[name]):
            problems.append(f"service 'code-location' does not depend on {host!r}")
    return list(dict.fromkeys(problems))


def find_command_option(command: list | str, *options: str) -> str | None:
    tokens = shlex.split(command) if isinstance(command, str) else [str(t) for t in command]
    for i, token in enumerate(tokens[:-1]):
        if token in options:
            return tokens[i + 1]
    return None


# --------------------------------------------------------------------------
# compose.yaml
# --------------------------------------------------------------------------


def test_variable_regex_handles_every_form():
    text = "${A} ${B:-x} ${C-y} ${D:?set D} ${E?e} ${F:+z} $${NOT_A_VAR} $$G"
    found = compose_variables(text)
    assert found == {
        "A": [("", "")],
        "B": [(":-", "x")],
        "C": [("-", "y")],
        "D": [(":?", "set D")],
        "E": [("?", "e")],
        "F": [(":+", "z")],
    }


def test_compose_has_no_problems():
    assert compose_problems(load_compose()) == []


def test_compose_helper_reports_a_broken_compose():
    compose = copy.deepcopy(load_compose())
    services = compose["services"]
    del services["spark-worker"]
    services["webserver"].pop("ports")
    services["postgres"]["environment"]["POSTGRES_PASSWORD"] = "hunter2"
    services["daemon"]["depends_on"] = {"ghost": {"condition": "service_started"}}
    services["minio"]["volumes"] = ["minio-cache:/data"]
    services["code-location"]["environment"]["WIRE_S3_ENDPOINT"] = "http://localhost:9000"
    services["minio"]["environment"]["MINIO_REGION"] = "${WIRE_S3_SECRET_KEY:-minioadmin}"

    problems = "\n".join(compose_problems(compose))

    assert "missing service 'spark-worker'" in problems
    assert "'webserver' does not publish port(s) [3000]" in problems
    assert "POSTGRES_PASSWORD must be a required" in problems
    assert "depends on unknown service 'ghost'" in problems
    assert "undeclared volume 'minio-cache'" in problems
    assert "'minio' keeps /data outside a named volume" in problems
    assert "named volume 'minio-data' is declared but no service uses it" in problems
    assert "${WIRE_S3_SECRET_KEY:-minioadmin}" in problems
    assert "WIRE_S3_ENDPOINT='http://localhost:9000'" in problems


def test_required_secrets_use_required_syntax():
    variables = variables_in(load_compose())
    for secret in ("WIRE_S3_ACCESS_KEY", "WIRE_S3_SECRET_KEY", "DAGSTER_PG_PASSWORD"):
        assert secret in variables, secret
        assert {op for op, _ in variables[secret]} == {":?"}, (secret, variables[secret])


def test_every_compose_variable_is_documented():
    variables = set(variables_in(load_compose()))
    entries = env_example_entries(ENV_EXAMPLE.read_text())
    readme = README.read_text()

    assert variables, "the compose file uses no variable at all?"
    assert sorted(variables - set(entries)) == [], "missing from docker/.env.example"
    assert sorted(v for v in variables if f"`{v}`" not in readme) == [], "missing from docker/README.md"
    assert sorted(set(entries) - variables) == [], "docker/.env.example lists variables compose does not use"
    for name, (_value, comments) in entries.items():
        assert comments, f"{name} has no comment in docker/.env.example"


def test_env_example_leaves_secrets_empty():
    entries = env_example_entries(ENV_EXAMPLE.read_text())
    secrets = [name for name in entries if SECRET_NAME.search(name)]
    assert set(secrets) >= {"WIRE_S3_ACCESS_KEY", "WIRE_S3_SECRET_KEY", "DAGSTER_PG_PASSWORD"}
    for name in secrets:
        value, comments = entries[name]
        assert value == "", f"{name} has a value in docker/.env.example"
        assert any("fill" in c.lower() for c in comments), f"{name}: no 'fill in' comment"


def test_env_example_defaults_match_compose_defaults():
    """A default written in .env.example is the compose file's own default."""
    entries = env_example_entries(ENV_EXAMPLE.read_text())
    for name, uses in variables_in(load_compose()).items():
        for op, arg in uses:
            if op in (":-", "-"):
                assert entries[name][0] == arg, (name, entries[name][0], arg)


def test_services_wiring():
    services = load_compose()["services"]
    minio = services["minio"]
    assert shlex.split(minio["command"]) == ["server", "/data", "--console-address", ":9001"]
    assert minio.get("healthcheck", {}).get("test")
    assert services["postgres"]["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(map(str, services["postgres"]["healthcheck"]["test"]))

    init = services["minio-init"]
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    init_command = " ".join(map(str, init["command"]))
    assert "mc mb" in init_command and "WIRE_S3_BUCKET" in init_command
    assert "WIRE_S3_BUCKET" in env_of(init)

    for name in DAGSTER_SERVICES:
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name

    worker_command = [str(t) for t in services["spark-worker"]["command"]]
    assert "spark://spark-master:7077" in worker_command
    assert "org.apache.spark.deploy.worker.Worker" in worker_command
    master_command = [str(t) for t in services["spark-master"]["command"]]
    assert "org.apache.spark.deploy.master.Master" in master_command
    assert find_command_option(master_command, "--port") == "7077"

    webserver = [str(t) for t in services["webserver"]["command"]]
    assert webserver[0] == "dagster-webserver"
    assert find_command_option(webserver, "-p", "--port") == "3000"
    assert find_command_option(webserver, "-h", "--host") == "0.0.0.0"
    assert find_command_option(services["daemon"]["command"], "-w", "--workspace") == (
        find_command_option(webserver, "-w", "--workspace")
    )
    code = [str(t) for t in services["code-location"]["command"]]
    assert code[:3] == ["dagster", "code-server", "start"]
    assert find_command_option(code, "-h", "--host") == "0.0.0.0"
    assert find_command_option(code, "-f", "--python-file") == "/opt/wire/definitions.py"


def test_project_image_is_built_from_the_repository_root():
    images = project_image_services(load_compose())
    assert {"code-location", "webserver", "daemon", "spark-worker"} <= set(images)
    tags = {s.get("image") for s in images.values()}
    assert len(tags) == 1, f"services build different images: {tags}"
    for name, service in images.items():
        context, dockerfile = build_context(service)
        assert context == ROOT, (name, context)
        assert dockerfile == DOCKERFILE, (name, dockerfile)


def test_runs_attach_to_spark_connect_by_default():
    compose = load_compose()
    assert spark_connect_problems(compose) == []
    # A copy of .env.example keeps the default; an empty value switches Spark Connect off (so `-`,
    # which keeps an empty value, not `:-`, which would replace it by the default).
    entries = env_example_entries(ENV_EXAMPLE.read_text())
    default = interpolate_unset(env_of(compose["services"]["code-location"])["WIRE_SPARK_REMOTE"] or "")
    assert entries["WIRE_SPARK_REMOTE"][0] == default == "sc://spark-connect:15002"
    assert {op for op, _ in variables_in(compose)["WIRE_SPARK_REMOTE"]} == {"-"}


def test_spark_connect_helper_reports_an_optional_server():
    compose = copy.deepcopy(load_compose())
    services = compose["services"]
    services["spark-connect"]["profiles"] = ["connect"]
    services["code-location"]["depends_on"].pop("spark-connect")
    services["daemon"]["environment"]["WIRE_SPARK_REMOTE"] = "${WIRE_SPARK_REMOTE:-}"
    services["webserver"]["environment"]["WIRE_SPARK_REMOTE"] = "sc://spark-master:15002"

    problems = "\n".join(spark_connect_problems(compose))

    assert "service 'spark-connect' only runs in profile(s) ['connect']" in problems
    assert "service 'code-location' does not depend on 'spark-connect'" in problems
    assert "service 'daemon': WIRE_SPARK_REMOTE defaults to ''" in problems
    assert "service 'spark-master' does not start a Spark Connect server" in problems


# --------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------


def test_dockerfile_has_no_problems():
    context, dockerfile = build_context(load_compose()["services"]["code-location"])
    assert dockerfile_problems(dockerfile.read_text(), context) == []


def test_dockerfile_helper_reports_a_broken_dockerfile(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    broken = "\n".join(
        [
            "FROM debian:bookworm",
            "RUN apt-get install -y openjdk-11-jre-headless \\",
            "    && echo done",
            "COPY pyproject.toml ./",
            "COPY --chown=1000 missing_dir/ missing_dir/",
            'COPY ["also_missing.py", "./"]',
            "COPY --from=builder /opt/venv /opt/venv",
            "RUN pip install .",
        ]
    )
    problems = "\n".join(dockerfile_problems(broken, tmp_path))
    assert "base image" in problems
    assert "COPY missing_dir/: not in the build context" in problems
    assert "COPY also_missing.py: not in the build context" in problems
    assert "pyproject.toml" not in problems
    assert "COPY /opt/venv" not in problems  # --from=builder is not the context
    assert "Java 17" in problems
    assert "PYSPARK_PYTHON" in problems
    assert "pip install ." not in problems


def test_dockerfile_installs_what_the_instance_needs():
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    env = dockerfile_env(instructions)
    runs = " ".join(args for word, args in instructions if word == "RUN")
    services = load_compose()["services"]

    # docker/dagster.yaml uses PostgreSQL storage, which lives in dagster-postgres.
    assert re.search(r"pip install[^&;]*dagster-postgres", runs)
    assert ("WORKDIR", "/opt/wire") in instructions

    copies = {}
    for word, args in instructions:
        if word == "COPY":
            flags, sources, dest = copy_args(args)
            for source in sources:
                copies[source] = dest
    dagster_home = env["DAGSTER_HOME"]
    assert env_of(services["webserver"])["DAGSTER_HOME"] == dagster_home
    assert PurePosixPath(copies["docker/dagster.yaml"]) == PurePosixPath(dagster_home) / "dagster.yaml"
    workspace = find_command_option(services["webserver"]["command"], "-w")
    assert workspace is not None, "the webserver's command names its workspace with -w"
    assert PurePosixPath(copies["docker/workspace.yaml"]) == PurePosixPath(workspace)
    # the code location loads /opt/wire/definitions.py and /opt/wire/pipelines
    assert copies["definitions.py"] in ("./", ".", "/opt/wire/", "/opt/wire/definitions.py")
    assert copies["pipelines/"].rstrip("/") in ("pipelines", "/opt/wire/pipelines")


def pyproject_layout() -> tuple[list[str], list[str]]:
    """(packages, py-modules) that pyproject.toml installs."""
    tool = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]
    return list(tool.get("packages", [])), list(tool.get("py-modules", []))


def copied_sources(text: str) -> list[str]:
    """Context paths the Dockerfile COPYs or ADDs (not from another stage or image)."""
    out = []
    for word, args in dockerfile_instructions(text):
        if word in ("COPY", "ADD"):
            flags, sources, _dest = copy_args(args)
            if "from" not in flags:
                out += [src for src in sources if not re.match(r"^[a-z]+://", src)]
    return out


def test_dockerfile_installs_from_the_lock():
    """Every version in the image is requirements.lock's (the versions `make` installs and the
    tests ran), and the project's install finds every package pyproject.toml names."""
    packages, modules = pyproject_layout()
    assert install_problems(DOCKERFILE.read_text(), packages, modules) == []


def test_install_helper_reports_floating_versions_and_missing_packages():
    broken = "\n".join(
        [
            "FROM python:3.11-slim-bookworm",
            "COPY pyproject.toml ./",
            "RUN mkdir -p pkg && touch pkg/__init__.py definitions.py && pip install . 'dagster-postgres>=0.29'",
            "RUN pip install -c requirements.lock extra",
            "COPY requirements.lock ./",
            "RUN python -m pip install --constraint requirements.lock other",
            "COPY pkg/*.py pkg/",
            "COPY definitions.py ./",
            "RUN pip install --no-deps .",
        ]
    )
    problems = install_problems(broken, ["pkg", "benchmarks"], ["definitions"])
    text = "\n".join(problems)
    assert "`pip install . dagster-postgres>=0.29` does not install from requirements.lock" in text
    assert "`pip install -c requirements.lock extra`: requirements.lock is not COPYed before it" in text
    assert "other" not in text  # constrained, the lock COPYed before it
    assert "--no-deps" not in text.replace("`pip install --no-deps .`: benchmarks", "")  # no versions to pin
    assert sum("benchmarks is neither COPYed before it nor a stand-in" in p for p in problems) == 2
    assert "pkg is neither" not in text and "definitions.py is neither" not in text


def lock_pins() -> dict[str, str]:
    """Normalised name -> pinned version in requirements.lock."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


def test_lock_pins_the_postgres_storage_that_is_installed():
    """dagster-postgres (docker/dagster.yaml's storage; the test extra installs it for
    tests/test_e2e_postgres.py) and its psycopg2 are pinned, match the pinned dagster, and are
    the versions installed here."""
    from importlib.metadata import requires, version

    pins = lock_pins()
    assert {"dagster-postgres", "psycopg2-binary"} <= set(pins), "dagster-postgres/psycopg2-binary not in the lock"
    assert version("dagster-postgres") == pins["dagster-postgres"]
    assert version("psycopg2-binary") == pins["psycopg2-binary"]
    needs = [r.replace(" ", "") for r in requires("dagster-postgres") or [] if "extra ==" not in r]
    assert f"dagster=={pins['dagster']}" in needs, needs
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["test"]
    assert any(re.match(r"dagster-postgres\b", r) for r in extra), "dagster-postgres is not in the test extra"


def test_dockerignore_keeps_the_build_context_small():
    """The build context is the repository root: its .dockerignore leaves out the ~2 GB .venv,
    local state, .git, caches, test output and docker/.env, and nothing the Dockerfile COPYs."""
    context, dockerfile = build_context(load_compose()["services"]["code-location"])
    ignore = context / ".dockerignore"
    assert ignore.is_file(), f"no .dockerignore at the build context's root {context}"
    assert dockerignore_problems(ignore.read_text(), context, copied_sources(dockerfile.read_text())) == []


def test_dockerignore_helpers_follow_dockers_rules():
    patterns = dockerignore_patterns("# a comment\n/build\n**/__pycache__\ndocs/*.md\n!docs/keep.md\nx # y\n")
    assert dockerignored("build/lib/a.py", patterns) and not dockerignored("src/build", patterns)
    assert dockerignored("a/b/__pycache__/c.pyc", patterns) and dockerignored("__pycache__/c.pyc", patterns)
    assert dockerignored("docs/a.md", patterns) and not dockerignored("docs/keep.md", patterns)
    assert not dockerignored("docs/sub/a.md", patterns)  # `*` stays within one path element
    assert dockerignored("x # y", patterns) and not dockerignored("x", patterns)  # no trailing comments

    problems = "\n".join(
        dockerignore_problems(".venv\n**/*.py\n!definitions.py\n", ROOT, ["wire_dagster/", "definitions.py"])
    )
    assert ".git/HEAD is not excluded from the build context" in problems
    assert "docker/.env is not excluded from the build context" in problems
    assert ".venv/bin/python" not in problems
    assert "COPY wire_dagster/: wire_dagster/spec.py is excluded by .dockerignore" in problems
    assert "COPY definitions.py" not in problems


# --------------------------------------------------------------------------
# dagster.yaml and workspace.yaml
# --------------------------------------------------------------------------


def tag_limits(instance_config: dict) -> list:
    """tag_concurrency_limits wherever Dagster accepts them."""
    limits = list(((instance_config.get("concurrency") or {}).get("runs") or {}).get("tag_concurrency_limits") or [])
    coordinator = instance_config.get("run_coordinator") or {}
    if coordinator.get("class") == "QueuedRunCoordinator":
        limits += (coordinator.get("config") or {}).get("tag_concurrency_limits") or []
    limits += (instance_config.get("run_queue") or {}).get("tag_concurrency_limits") or []
    return limits


def test_dagster_yaml_names_postgres_storage_and_the_tag_limit():
    config = yaml.safe_load(DAGSTER_YAML.read_text())
    pg = config["storage"]["postgres"]["postgres_db"]
    compose_env = env_of(load_compose()["services"]["daemon"])
    for field in ("username", "password", "hostname", "db_name"):
        assert isinstance(pg[field], dict) and set(pg[field]) == {"env"}, f"{field} is not an env: reference"
        assert pg[field]["env"] in compose_env, f"{pg[field]['env']} is not set by compose"
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["run_launcher"]["class"] == "DefaultRunLauncher"
    assert TAG_LIMIT in tag_limits(config)


def test_dagster_yaml_names_the_installed_postgres_driver():
    """SQLAlchemy 2.1 reads a bare `postgresql://` as psycopg 3; dagster-postgres brings psycopg2,
    so the storage names it, and SQLAlchemy resolves that scheme to it here."""
    from sqlalchemy.engine import make_url

    db = yaml.safe_load(DAGSTER_YAML.read_text())["storage"]["postgres"]["postgres_db"]
    assert db.get("scheme") == "postgresql+psycopg2"
    assert make_url(f"{db['scheme']}://u@h/d").get_dialect().driver == "psycopg2"
    import psycopg2  # noqa: F401  (installed with dagster-postgres, the test extra)


def test_workspace_yaml_points_at_the_code_location():
    workspace = yaml.safe_load(WORKSPACE_YAML.read_text())
    services = load_compose()["services"]
    [entry] = workspace["load_from"]
    grpc = entry["grpc_server"]
    assert grpc == {"host": "code-location", "port": 4000, "location_name": "wire"}
    assert grpc["host"] in services
    code = services["code-location"]["command"]
    assert find_command_option(code, "-p", "--port") == str(grpc["port"])
    assert find_command_option(code, "--location-name") in (None, grpc["location_name"])


# With dagster installed, validate against Dagster's own schema.


@pytest.fixture
def dagster_env(monkeypatch):
    values = {
        "DAGSTER_PG_USER": "wire_user",
        "DAGSTER_PG_PASSWORD": "test-only-password",
        "DAGSTER_PG_HOST": "postgres",
        "DAGSTER_PG_DB": "wire_db",
        "DAGSTER_PG_PORT": "5432",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def test_dagster_yaml_passes_dagsters_instance_schema(tmp_path, dagster_env):
    pytest.importorskip("dagster")
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.storage.config import pg_config

    (tmp_path / "dagster.yaml").write_text(DAGSTER_YAML.read_text())
    config, custom_class = dagster_instance_config(str(tmp_path))
    assert custom_class is None
    assert TAG_LIMIT in tag_limits(dict(config))

    # The `env:` references resolve against the environment compose sets.
    resolved = process_config(pg_config(), config["storage"]["postgres"])
    assert resolved.success and resolved.value is not None, resolved.errors
    db = resolved.value["postgres_db"]
    assert (db["username"], db["password"], db["hostname"], db["db_name"], db["port"]) == (
        "wire_user",
        "test-only-password",
        "postgres",
        "wire_db",
        5432,
    )


def test_dagster_instance_builds_queue_and_launcher(tmp_path):
    """The instance this file describes, with SQLite in place of PostgreSQL
    (no PostgreSQL server here; tests/test_e2e_postgres.py starts one): the run
    coordinator and the launcher load, and the queue carries the per-pipeline limit."""
    pytest.importorskip("dagster")
    from dagster import DagsterInstance, DefaultRunLauncher, QueuedRunCoordinator

    config = yaml.safe_load(DAGSTER_YAML.read_text())
    config["storage"] = {"sqlite": {"base_dir": str(tmp_path / "storage")}}
    if "compute_logs" in config:
        config["compute_logs"].setdefault("config", {})["base_dir"] = str(tmp_path / "logs")
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))

    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        assert isinstance(instance.run_launcher, DefaultRunLauncher)
        queue = instance.get_concurrency_config().run_queue_config
        assert queue is not None and TAG_LIMIT in queue.tag_concurrency_limits
    finally:
        instance.dispose()


def test_dagster_schema_check_rejects_a_broken_instance(tmp_path, dagster_env):
    pytest.importorskip("dagster")
    from dagster._core.errors import DagsterInvalidConfigError
    from dagster._core.instance.config import dagster_instance_config

    config = yaml.safe_load(DAGSTER_YAML.read_text())
    postgres_db = config["storage"]["postgres"]["postgres_db"]
    postgres_db["hostnme"] = postgres_db.pop("hostname")  # a typo Dagster must refuse
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(DagsterInvalidConfigError):
        dagster_instance_config(str(tmp_path))


def test_workspace_yaml_passes_dagsters_workspace_schema():
    pytest.importorskip("dagster")
    from dagster._core.workspace.config_schema import process_workspace_config

    result = process_workspace_config(yaml.safe_load(WORKSPACE_YAML.read_text()))
    assert result.success, result.errors
    typo = {"load_from": [{"grpc_server": {"hots": "code-location", "port": 4000}}]}
    assert not process_workspace_config(typo).success


def test_local_instance_yaml_monitors_and_retries_dead_runs(tmp_path):
    """The instance `wire dev`, `wire tick` and the tests create (devstack.instance_yaml) passes
    Dagster's schema and frees the pool slot of a run whose worker died, then retries it:
    without both, a kill -9 leaves the pipeline's only slot claimed forever."""
    pytest.importorskip("dagster")
    from dagster import DagsterInstance, QueuedRunCoordinator
    from dagster._core.instance.config import dagster_instance_config

    from wire_dagster.devstack import instance_yaml

    (tmp_path / "dagster.yaml").write_text(instance_yaml(tmp_path))
    config, custom_class = dagster_instance_config(str(tmp_path))
    assert custom_class is None
    mon, retries = config["run_monitoring"], config["run_retries"]
    assert mon["enabled"] and mon["free_slots_after_run_end_seconds"] > 0 and mon["max_resume_run_attempts"] == 0
    assert retries["enabled"] and retries["max_retries"] >= 1 and retries["retry_on_asset_or_op_failure"] is False
    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        assert instance.run_monitoring_enabled and instance.run_retries_enabled
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, QueuedRunCoordinator) and coordinator.dequeue_interval_seconds == 1
    finally:
        instance.dispose()
