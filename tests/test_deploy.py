"""The deployment files (compose, Kubernetes, the Dockerfile, Redis's config and ACL), held to the code they deploy.

No Docker engine runs the suite, so no image is built and no container started. Instead the files are parsed and
checked against the settings they configure and against each other, and the Redis files are loaded into a real
redis-server, where the real worker process does its whole job as the least-privileged user of the ACL.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.retry import Retry

from tests.conftest import FAST, require_redis_server
from tests.redis_server import RedisServer, free_port
from tests.streams import (
    ALERTS,
    EVENTS,
    FP,
    GROUP,
    alerts,
    clean_env,
    dead_letters,
    pending_count,
    publish,
    run_in_process,
    start_worker,
    stop,
    wait_until,
    worker_command,
)
from worker import inbox, library
from worker.cli import build_parser
from worker.fingerprint import fingerprint
from worker.index import FingerprintIndex
from worker.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
KUBERNETES = DEPLOY / "kubernetes"
REDIS_CONF = DEPLOY / "redis" / "redis.conf"
ACL_TEMPLATE = DEPLOY / "redis" / "users.acl"
RENDER_ACL = DEPLOY / "redis" / "render-acl.sh"

WORKER_USER = "incident-worker"
PRODUCER_USER = "incident-producer"
SUBSCRIBER_USER = "incident-subscriber"
PASSWORDS = {
    "REDIS_WORKER_PASSWORD": "test-worker-pa55",
    "REDIS_PRODUCER_PASSWORD": "test-producer-pa55",
    "REDIS_SUBSCRIBER_PASSWORD": "test-subscriber-pa55",
    "REDIS_ADMIN_PASSWORD": "test-admin-pa55",
}
USER_PASSWORDS = {
    WORKER_USER: "REDIS_WORKER_PASSWORD",
    PRODUCER_USER: "REDIS_PRODUCER_PASSWORD",
    SUBSCRIBER_USER: "REDIS_SUBSCRIBER_PASSWORD",
    "admin": "REDIS_ADMIN_PASSWORD",
}
NAMESPACE_PATTERN = "~{incidents}:*"

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


# -- reading the files ----------------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted([COMPOSE, *DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


_INTERPOLATION = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's interpolation of `${NAME}`, `${NAME:-default}`, `${NAME-default}` and `$$`, with `env` as the shell."""
    env = env or {}

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op = match.group("name"), match.group("op")
        if name in env and (env[name] or op != ":-"):
            return env[name]
        if op is None:
            raise AssertionError(f"docker-compose.yml needs ${{{name}}} set: give it a default")
        return match.group("default")

    return _INTERPOLATION.sub(replace, value)


def worker_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services built from deploy/Dockerfile that run workers (load-functions apart)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if isinstance(service.get("build"), dict)
        and service["build"].get("dockerfile") == "deploy/Dockerfile"
        and service.get("command") != ["load-functions"]
    }


def compose_environment(service: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {name: interpolate(str(value), env) for name, value in raw.items()}


def kubernetes_documents() -> dict[str, dict[str, Any]]:
    """Every Kubernetes object of deploy/kubernetes by kind (one of each), kustomization.yaml apart."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            assert document["kind"] not in found, f"two {document['kind']} objects"
            found[document["kind"]] = document
    return found


def worker_container(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    [container] = documents["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped, one list per stage."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += (" " if pending else "") + stripped.removesuffix("\\").strip()
        if stripped.endswith("\\"):
            continue
        keyword, _, rest = pending.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    stages: list[list[tuple[str, str]]] = []
    arguments = {}
    for keyword, rest in instructions:
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            arguments[name] = default
            continue
        if keyword == "FROM":
            image = rest.split()[0]
            for name, default in arguments.items():
                image = image.replace("${" + name + "}", default)
            stages.append([(keyword, image + rest[len(rest.split()[0]) :])])
            continue
        stages[-1].append((keyword, rest))
    return stages


def dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a worker process would build from exactly these environment variables."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def worker_variables(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(ENV_PREFIX)}


def batch_bound_s(settings: Settings) -> float:
    """The longest a stopping worker needs: waiting in XREADGROUP, then one batch's server time (socket timeout)."""
    return settings.block_ms / 1000 + settings.socket_timeout_s


def duration_s(text: str) -> float:
    """Compose's duration format: 60s, 1m30s, 500ms."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a compose duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def kubernetes_environment(documents: dict[str, dict[str, Any]], pod_name: str = "worker-7d9f-x2") -> dict[str, str]:
    """The worker container's environment: the ConfigMap, the Secret (placeholder filled in), the Deployment's env."""
    container = worker_container(documents)
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        if "configMapRef" in source:
            assert source["configMapRef"]["name"] == documents["ConfigMap"]["metadata"]["name"]
            env.update(documents["ConfigMap"]["data"])
        if "secretRef" in source:
            assert source["secretRef"]["name"] == documents["Secret"]["metadata"]["name"]
            env.update(filled_secret(documents["Secret"]))
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = pod_name
    return env


def filled_secret(secret: dict[str, Any]) -> dict[str, str]:
    data = dict(secret["stringData"])
    placeholders = [value for value in data.values() if "REPLACE" in value]
    assert placeholders, "the Secret template should hold an obvious placeholder, not a password"
    return {name: value.replace("REPLACE-WITH-THE-WORKER-PASSWORD", "s3cret") for name, value in data.items()}


# -- every file parses; every variable is a setting -----------------------------------------------------------


@pytest.mark.parametrize("path", yaml_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_yaml_file_parses(path: Path) -> None:
    documents = list(yaml.safe_load_all(path.read_text()))
    assert documents and all(isinstance(document, dict) for document in documents)


def test_every_incident_worker_variable_named_anywhere_in_the_deployment_is_a_setting() -> None:
    # Comments and the README included: a misspelt name in a how-to is as wrong as one in a manifest.
    files = [COMPOSE, DOCKERFILE, *[path for path in DEPLOY.rglob("*") if path.is_file()]]
    named = {
        match.group(1).lower()
        for path in files
        for match in re.finditer(ENV_PREFIX + r"([A-Z][A-Z0-9_]*)", path.read_text())
    }
    assert named, "the deployment configures no setting at all"
    assert named <= set(Settings.model_fields), f"not settings: {sorted(named - set(Settings.model_fields))}"


def _compose_sources() -> list[str]:
    return [f"compose:{name}" for name in worker_services(load_compose())]


@pytest.mark.parametrize("source", [*_compose_sources(), "kubernetes", "dockerfile"])
def test_configured_variables_are_settings_and_pass_validation(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if source.startswith("compose:"):
        env = compose_environment(load_compose()["services"][source.removeprefix("compose:")])
    elif source == "kubernetes":
        env = kubernetes_environment(kubernetes_documents())
    else:
        env = dockerfile_env(dockerfile_stages()[-1])
    variables = worker_variables(env)
    assert variables, f"{source} sets no INCIDENT_WORKER_* variable"
    unknown = sorted(name for name in variables if name.removeprefix(ENV_PREFIX).lower() not in Settings.model_fields)
    assert not unknown, f"{source} sets variables that are no setting: {unknown}"
    settings = settings_from(variables, monkeypatch)
    assert settings.log_format == "json", "containers log JSON lines"
    for name, value in variables.items():
        field = name.removeprefix(ENV_PREFIX).lower()
        stored = getattr(settings, field)
        stored = stored.get_secret_value() if hasattr(stored, "get_secret_value") else stored
        assert str(stored) == value or stored == type(stored)(value), f"{name}={value!r} read as {stored!r}"


# -- docker-compose.yml ---------------------------------------------------------------------------------------


def _conf_directives(text: str) -> dict[str, str]:
    directives: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            directives[name.lower()] = value.strip()
    return directives


def _mounted(service: dict[str, Any], container_path: str) -> Path | str:
    """The host path (a Path) or named volume (a str) the service mounts at or above `container_path`."""
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if container_path == target or container_path.startswith(target + "/"):
            if source.startswith((".", "/")):
                return ROOT / source / Path(container_path).relative_to(target)
            return source
    raise AssertionError(f"nothing is mounted at {container_path}")


def test_compose_runs_redis_7_with_aof_on_a_named_volume() -> None:
    compose = load_compose()
    redis_service = compose["services"]["redis"]
    assert redis_service["image"] == "redis:7"
    command = redis_service["command"]
    assert command[0] == "redis-server"
    conf_path = _mounted(redis_service, command[1])
    assert conf_path == REDIS_CONF, "compose starts Redis with another redis.conf than deploy/redis/redis.conf"
    conf = _conf_directives(REDIS_CONF.read_text())
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    volume = _mounted(redis_service, conf["dir"])
    assert isinstance(volume, str) and volume in compose["volumes"], "the AOF directory must be a named volume"
    assert redis_service["restart"] in {"always", "unless-stopped"}


def test_compose_renders_the_acl_where_redis_conf_reads_it() -> None:
    redis_service = load_compose()["services"]["redis"]
    entrypoint = redis_service["entrypoint"]
    script, template, rendered = entrypoint[1], entrypoint[2], entrypoint[3]
    assert _mounted(redis_service, script) == RENDER_ACL
    assert _mounted(redis_service, template) == ACL_TEMPLATE
    assert rendered == _conf_directives(REDIS_CONF.read_text())["aclfile"]
    assert str(Path(rendered).parent) in redis_service["tmpfs"], "the rendered ACL belongs in a tmpfs"
    assert entrypoint[4:] == ["docker-entrypoint.sh"], "Redis must still start through the image's entrypoint"


def test_compose_healthchecks_redis_as_the_worker_user_with_a_password() -> None:
    redis_service = load_compose()["services"]["redis"]
    test = " ".join(redis_service["healthcheck"]["test"])
    assert "redis-cli" in test and "ping" in test and "PONG" in test
    assert f"--user {WORKER_USER}" in test and "REDISCLI_AUTH" in test
    assert "REDIS_WORKER_PASSWORD" in redis_service["environment"]


def test_compose_runs_two_workers_that_wait_for_a_healthy_redis() -> None:
    compose = load_compose()
    workers = worker_services(compose)
    replicas = {name: service.get("deploy", {}).get("replicas", 1) for name, service in workers.items()}
    assert sum(replicas.values()) == 2
    consumers = []
    for name, service in workers.items():
        env = compose_environment(service)
        if "INCIDENT_WORKER_CONSUMER" in env:
            assert replicas[name] == 1, f"{name}: replicas of one service would share its consumer name"
            consumers.append(env["INCIDENT_WORKER_CONSUMER"])
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["restart"] in {"always", "unless-stopped", "on-failure"}
        assert service["healthcheck"]["test"][:3] == ["CMD", "incident-worker", "check"]
    assert len(consumers) == len(set(consumers)), "two workers with one consumer name"


def test_compose_gives_workers_longer_than_a_batch_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, service in worker_services(load_compose()).items():
        settings = settings_from(worker_variables(compose_environment(service)), monkeypatch)
        grace = duration_s(service["stop_grace_period"])
        assert grace > batch_bound_s(settings), f"{name}: {grace}s to stop, a batch may take {batch_bound_s(settings)}s"


def test_compose_passwords_are_placeholders_that_match(tmp_path: Path) -> None:
    compose = load_compose()
    redis_env = compose_environment(compose["services"]["redis"])
    for name in PASSWORDS:
        assert "dev-only" in redis_env[name] and "not-a-secret" in redis_env[name], f"{name} is no obvious placeholder"
    for name, service in worker_services(compose).items():
        url = urlsplit(compose_environment(service)["INCIDENT_WORKER_REDIS_URL"])
        assert url.username == WORKER_USER, name
        assert url.password == redis_env["REDIS_WORKER_PASSWORD"], f"{name} logs in with another password"
        assert (url.hostname, url.port, url.path) == ("redis", 6379, "/0")
    # The same wiring with passwords given in the shell: the workers follow the variable, not the default.
    chosen = {"REDIS_WORKER_PASSWORD": "chosen-pw", "REDIS_ADMIN_PASSWORD": "chosen-admin"}
    for service in worker_services(compose).values():
        assert urlsplit(compose_environment(service, chosen)["INCIDENT_WORKER_REDIS_URL"]).password == "chosen-pw"
    assert compose_environment(compose["services"]["redis"], chosen)["REDIS_WORKER_PASSWORD"] == "chosen-pw"


def test_compose_loads_the_functions_as_admin_before_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = load_compose()
    step = compose["services"]["load-functions"]
    assert step["command"] == ["load-functions"] and step["restart"] == "no"
    assert step["build"] == next(iter(worker_services(compose).values()))["build"], "another image than the workers'"
    assert step["depends_on"]["redis"]["condition"] == "service_healthy"
    env = compose_environment(step)
    admin_url = urlsplit(env["INCIDENT_WORKER_ADMIN_REDIS_URL"])
    redis_env = compose_environment(compose["services"]["redis"])
    assert (admin_url.username, admin_url.password) == ("admin", redis_env["REDIS_ADMIN_PASSWORD"])
    settings_from(worker_variables(env), monkeypatch)  # valid settings
    for name, service in worker_services(compose).items():
        assert service["depends_on"]["load-functions"]["condition"] == "service_completed_successfully", name
        variables = compose_environment(service)
        assert "INCIDENT_WORKER_ADMIN_REDIS_URL" not in variables, f"{name} is given the admin's URL"
        assert redis_env["REDIS_ADMIN_PASSWORD"] not in json.dumps(variables), f"{name} is given the admin's password"


# -- Kubernetes -----------------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_names_the_image() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    manifests = {path.name for path in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == manifests
    image = worker_container(kubernetes_documents())["image"]
    assert image in {entry["name"] for entry in kustomization["images"]}
    assert {"Deployment", "ConfigMap", "Secret", "Service"} <= set(kubernetes_documents())


def test_kustomize_builds_the_manifests_with_the_image_set() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH")
    built = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    documents = {document["kind"]: document for document in yaml.safe_load_all(built.stdout)}
    assert set(documents) == {"Deployment", "ConfigMap", "Secret", "Service", "Job"}
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    [image] = kustomization["images"]
    assert worker_container(documents)["image"] == f"{image['newName']}:{image['newTag']}"


def test_a_job_loads_the_functions_as_admin_and_the_workers_never_see_its_secret() -> None:
    documents = kubernetes_documents()
    job = documents["Job"]
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["load-functions"]
    assert container["image"] == worker_container(documents)["image"]
    assert pod["restartPolicy"] == "OnFailure" and job["spec"]["backoffLimit"] >= 3
    assert job["spec"]["ttlSecondsAfterFinished"] > 0, "a finished Job would block the next apply of a new image"
    [admin_url] = [item for item in container["env"] if item["name"] == f"{ENV_PREFIX}ADMIN_REDIS_URL"]
    secret = admin_url["valueFrom"]["secretKeyRef"]["name"]
    assert secret != documents["Secret"]["metadata"]["name"], "the admin's URL must not share the workers' Secret"
    assert secret in (KUBERNETES / "load-functions.yaml").read_text().split("kubectl create secret", 1)[1]
    assert pod["securityContext"]["runAsNonRoot"] is True and container["securityContext"]["readOnlyRootFilesystem"]
    assert secret not in (KUBERNETES / "deployment.yaml").read_text()
    assert f"{ENV_PREFIX}ADMIN_REDIS_URL" not in kubernetes_environment(documents)


def test_deployment_runs_two_replicas_with_probes_through_check() -> None:
    documents = kubernetes_documents()
    deployment = documents["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = worker_container(documents)
    liveness = container["livenessProbe"]["exec"]["command"]
    readiness = container["readinessProbe"]["exec"]["command"]
    assert liveness == ["incident-worker", "check"]
    assert readiness[:2] == ["incident-worker", "check"] and set(readiness[2:]) <= {"--redis-only"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["timeoutSeconds"] >= 5, "a probe starts Python and connects to Redis: give it time"
    consumer = [item for item in container["env"] if item["name"] == "INCIDENT_WORKER_CONSUMER"]
    assert consumer and consumer[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_deployment_has_resources_and_runs_read_only_as_non_root() -> None:
    documents = kubernetes_documents()
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    container = worker_container(documents)
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), f"resources.{kind}"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] not in (0, None)
    assert pod["securityContext"]["runAsUser"] == _dockerfile_uid(), "the image's user and the pod's differ"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]


def test_deployment_gives_workers_longer_than_a_batch_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = kubernetes_documents()
    settings = settings_from(worker_variables(kubernetes_environment(documents)), monkeypatch)
    grace = documents["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > batch_bound_s(settings)


def test_configmap_values_are_strings_and_the_secret_holds_only_the_url() -> None:
    documents = kubernetes_documents()
    data = documents["ConfigMap"]["data"]
    assert all(isinstance(value, str) for value in data.values()), "Kubernetes refuses non-string ConfigMap values"
    assert f"{ENV_PREFIX}REDIS_URL" not in data, "the Redis URL holds a password: it belongs in the Secret"
    assert set(documents["Secret"]["stringData"]) == {f"{ENV_PREFIX}REDIS_URL"}
    assert urlsplit(documents["Secret"]["stringData"][f"{ENV_PREFIX}REDIS_URL"]).username == WORKER_USER


def test_metrics_service_reaches_the_metrics_port() -> None:
    documents = kubernetes_documents()
    port = int(documents["ConfigMap"]["data"][f"{ENV_PREFIX}METRICS_PORT"])
    [container_port] = [p for p in worker_container(documents)["ports"] if p["containerPort"] == port]
    service = documents["Service"]["spec"]
    assert service["selector"].items() <= documents["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["ports"]] == [container_port["name"]]


@pytest.mark.parametrize("source", [*_compose_sources(), "kubernetes"])
def test_containers_serve_metrics_beyond_their_loopback(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default, 127.0.0.1, is right on a host and wrong in a container: a scraper comes from another address.
    if source == "kubernetes":
        env = kubernetes_environment(kubernetes_documents())
    else:
        env = compose_environment(load_compose()["services"][source.removeprefix("compose:")])
    settings = settings_from(worker_variables(env), monkeypatch)
    assert settings.metrics_port and settings.metrics_address == "0.0.0.0"
    assert Settings.model_fields["metrics_address"].default == "127.0.0.1"
    assert "INCIDENT_WORKER_METRICS_ADDRESS" in (DEPLOY / "README.md").read_text(), "deploy/README.md must say why"


def test_deploy_docs_do_not_say_an_out_of_memory_spell_makes_poison() -> None:
    # It once did; now a worker holds its batch through the spell (tests/test_worker_process.py pins that).
    for path in (DEPLOY / "README.md", REDIS_CONF):
        for paragraph in re.split(r"\n\s*\n|\n- ", path.read_text()):
            if re.search(r"\bOOM\b|out-of-memory|out of memory|noeviction", paragraph):
                assert "poison" not in paragraph, f"{path.name}: {paragraph[:200]}"


# -- the Dockerfile and its build context ---------------------------------------------------------------------


def _dockerfile_uid() -> int:
    users = [rest for keyword, rest in dockerfile_stages()[-1] if keyword == "USER"]
    assert users, "the runtime stage sets no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit(), f"USER {user}: give a numeric UID, which Kubernetes' runAsNonRoot can verify"
    return int(user)


def test_dockerfile_builds_on_slim_python_311_and_installs_the_project() -> None:
    stages = dockerfile_stages()
    for stage in stages:
        assert re.match(r"python:3\.11-slim", stage[0][1]), stage[0][1]
    runs = [rest for stage in stages for keyword, rest in stage if keyword == "RUN"]
    assert any("pip wheel" in run and run.rstrip().endswith(" .") for run in runs), "the project is not built"
    assert any("pip install" in run and "incident-fingerprint-worker" in run for run in runs)


def test_dockerfile_runs_incident_worker_as_non_root_with_a_healthcheck() -> None:
    final = dockerfile_stages()[-1]
    instructions = dict(final)
    assert _dockerfile_uid() != 0
    assert json.loads(instructions["ENTRYPOINT"]) == ["incident-worker"]
    assert json.loads(instructions["CMD"]) == ["run"]
    healthcheck = instructions["HEALTHCHECK"]
    assert json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())[:2] == ["incident-worker", "check"]
    assert dockerfile_env(final)[f"{ENV_PREFIX}LOG_FORMAT"] == "json"


def _dockerignore_excludes() -> Callable[[str], bool]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!"))
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((negated, re.compile(regex + r"\Z")))

    def excludes(path: str) -> bool:
        # Docker's rule: a pattern matching a path or any of its parent directories applies; the last one wins.
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        excluded = False
        for negated, regex in rules:
            if any(regex.match(prefix) for prefix in prefixes):
                excluded = not negated
        return excluded

    return excludes


def test_build_context_holds_what_the_image_is_built_from_and_nothing_private() -> None:
    excludes = _dockerignore_excludes()
    copied = [
        source
        for stage in dockerfile_stages()
        for keyword, rest in stage
        if keyword == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    ]
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file"
        assert not excludes(source), f"COPY {source}: .dockerignore leaves it out of the context"
    package = [str(path.relative_to(ROOT)) for path in (ROOT / "worker").rglob("*") if path.is_file()]
    package = [path for path in package if "__pycache__" not in path]
    assert package and not [path for path in package if excludes(path)]
    for private in (".git/config", ".venv/bin/python", ".env", "tests/test_deploy.py", "worker/__pycache__/x.pyc"):
        assert excludes(private), f"{private} would be sent to the Docker daemon"


# -- the ACL: rendered, documented, least privilege ------------------------------------------------------------


def render_acl(output: Path, passwords: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(PASSWORDS if passwords is None else passwords)}
    return subprocess.run(
        ["sh", str(RENDER_ACL), str(ACL_TEMPLATE), str(output)], env=env, capture_output=True, text=True, timeout=30
    )


def _rendered_rules(tmp_path: Path) -> dict[str, list[str]]:
    output = tmp_path / "users.acl"
    result = render_acl(output)
    assert result.returncode == 0, result.stderr
    return {line.split()[1]: line.split()[2:] for line in output.read_text().splitlines()}


def test_render_writes_one_line_per_user_with_hashed_passwords(tmp_path: Path) -> None:
    rules = _rendered_rules(tmp_path)
    assert set(rules) == {"default", *USER_PASSWORDS}
    assert "off" in rules["default"] and not any(rule.startswith(("#", ">", "nopass")) for rule in rules["default"])
    text = (tmp_path / "users.acl").read_text()
    for password in PASSWORDS.values():
        assert password not in text
    for user, variable in USER_PASSWORDS.items():
        assert "#" + hashlib.sha256(PASSWORDS[variable].encode()).hexdigest() in rules[user]
    assert oct((tmp_path / "users.acl").stat().st_mode & 0o777) == "0o600"


def test_render_refuses_to_run_without_a_password(tmp_path: Path) -> None:
    result = render_acl(tmp_path / "users.acl", {"REDIS_WORKER_PASSWORD": "only-this-one"})
    assert result.returncode != 0
    assert "REDIS_ADMIN_PASSWORD" in result.stderr
    assert not (tmp_path / "users.acl").exists()


NEVER_GRANTED = {
    # whole-server damage
    "flushall",
    "flushdb",
    "shutdown",
    "debug",
    "config",
    "acl",
    "function|load",
    "function|flush",
    "function|delete",
    "function|restore",
    # reads beyond the namespace: KEYS blocks the server, INFO and MONITOR show everyone's setup and traffic
    "keys",
    "info",
    "monitor",
    "select",
    # container commands granted whole where one subcommand is meant, and ad-hoc scripts beside the library
    "client",
    "function",
    "script",
    "eval",
}


def _split_selectors(rules: list[str]) -> tuple[list[str], list[str]]:
    """A user's rules as (its root permissions, the rules of its selectors `(+command ~key ...)`)."""
    root, selectors, depth = [], [], 0
    for rule in rules:
        depth += rule.startswith("(")
        (selectors if depth else root).append(rule)
        depth -= rule.endswith(")")
    return root, selectors


def test_worker_rules_grant_its_namespace_and_listed_commands_only(tmp_path: Path) -> None:
    rules, selected = _split_selectors(_rendered_rules(tmp_path)[WORKER_USER])
    selectors = " ".join(selected)
    # a selector grants one command on one key of the namespace: XDEL of dead letters (dead replay)
    assert selectors == "(+xdel ~{incidents}:dead)", selectors
    assert [rule for rule in rules if rule.startswith(("~", "%", "allkeys"))] == [NAMESPACE_PATTERN]
    assert "resetchannels" in rules and not [rule for rule in rules if rule.startswith("&") or rule == "allchannels"]
    assert rules.index("-@all") < min(i for i, rule in enumerate(rules) if rule.startswith("+"))
    granted = {rule[1:] for rule in rules if rule.startswith("+")}
    assert not [command for command in granted if command.startswith("@")], "no whole categories"
    assert not granted & NEVER_GRANTED, sorted(granted & NEVER_GRANTED)


def test_every_worker_permission_is_documented_in_the_template() -> None:
    lines = ACL_TEMPLATE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"user {WORKER_USER} "))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "\t")):
            break
        block.append(line.strip())
    permissions = [i for i, line in enumerate(block) if line.startswith("+")]
    assert len(permissions) > 20
    for i in permissions:
        above = i - 1
        while above >= 0 and block[above].startswith(("+", "(")):  # a selector's line is a permission too
            above -= 1
        assert above >= 0 and block[above].startswith("#"), f"{block[i]} has no comment saying why"
        assert " " not in block[i], f"one permission a line, so each can be read and removed: {block[i]}"


# -- the ACL on a real redis-server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server whose users are deploy/redis/users.acl, rendered with test passwords."""
    require_redis_server()
    directory = tmp_path_factory.mktemp("acl")
    result = render_acl(directory / "users.acl")
    assert result.returncode == 0, result.stderr
    server = RedisServer(directory, extra=["--aclfile", str(directory / "users.acl")])
    server.start()
    yield server
    server.stop()


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    client = acl_server.client(username="admin", password=PASSWORDS["REDIS_ADMIN_PASSWORD"], decode_responses=True)
    client.flushall()
    client.function_flush()
    library.load(client)  # the deployment's administrator step: workers may not load code
    client.acl_log_reset()
    yield client
    client.close()


@pytest.fixture
def worker_client(acl_server: RedisServer, admin: redis.Redis) -> Iterator[redis.Redis]:
    client = acl_server.client(username=WORKER_USER, password=PASSWORDS["REDIS_WORKER_PASSWORD"])
    yield client
    client.close()


def worker_url(server: RedisServer) -> str:
    return f"redis://{WORKER_USER}:{PASSWORDS['REDIS_WORKER_PASSWORD']}@127.0.0.1:{server.port}/0"


def refusals(admin: redis.Redis) -> list[str]:
    """What the ACL refused since the last reset, as `user context object reason`.

    CLIENT SETINFO is left out: redis-py tries it on every connection and ignores the refusal, and it cannot be
    granted in a file Redis 7.0 must load (the subcommand arrived in 7.2).
    """
    return [
        f"{entry['username']} {entry['context']} {entry['object']} {entry['reason']}"
        for entry in admin.acl_log()
        if entry["object"] != "client|setinfo"
    ]


SPEC_EVENTS: list[dict[str, Any]] = [
    {"incident_id": "47", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
    {"incident_id": "83", "features": {"weather": 4, "road": 2}},
    {"incident_id": "90", "features": {"dock": 3, "scanner": 2, "timeout": 1}},
    {"incident_id": "bad", "features": "{not json"},
    {"incident_id": "47", "features": {"something": 1, "else": 2}},
    {"incident_id": "83", "features": {"dock": 3, "scanner": 2, "timeout": 1}, "op": "upsert"},
    {"incident_id": "90", "op": "delete"},
]


@pytest.mark.parametrize("read_path", ["primary", "snapshot"])
def test_worker_process_does_its_whole_job_as_the_acl_user(
    acl_server: RedisServer, admin: redis.Redis, worker_client: redis.Redis, tmp_path: Path, read_path: str
) -> None:
    # read_path=auto turns to the snapshot at SNAPSHOT_MIN_INCIDENTS: both paths must work as the ACL user
    publish(worker_client, SPEC_EVENTS)
    # a previous run of this consumer left an entry pending: the restart counts its delivery (XCLAIM RETRYCOUNT)
    worker_client.xgroup_create(EVENTS, GROUP, id="0")
    worker_client.xreadgroup(GROUP, "acl-worker", {EVENTS: ">"}, count=1)
    log = tmp_path / "worker.log"
    # summaries every 0.2 s: the ACL user must be allowed the commands of the summary too
    worker = start_worker(
        worker_url(acl_server),
        "--until-idle",
        log=log,
        consumer="acl-worker",
        read_path=read_path,
        **{**FAST, "summary_interval_s": 0.2},
    )
    try:
        code = worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise
    assert code == 0, log.read_text()[-3000:]
    published = [(a.incident_id, [(m.incident_id, m.distance) for m in a.matches]) for a in alerts(admin)]
    assert published == [("90", [("47", 0)]), ("83", [("47", 0), ("90", 0)])]
    assert sorted(letter.reason for letter in dead_letters(admin)) == ["bad_json", "duplicate_id"]
    assert sorted(admin.hkeys(FP)) == ["47", "83"]
    assert pending_count(admin) == 0
    assert admin.get("{incidents}:heartbeat:acl-worker") is None, "the heartbeat was not removed at the stop"
    assert refusals(admin) == [], "the worker was refused something it swallowed"


@pytest.mark.parametrize("taken", ["xadd", "xack", "scard", "fcall"])
def test_a_right_taken_away_while_the_worker_runs_changes_nothing_until_it_is_given_back(
    acl_server: RedisServer, admin: redis.Redis, worker_client: redis.Redis, tmp_path: Path, taken: str
) -> None:
    """`ACL SETUSER incident-worker -xadd` (an edited ACL loaded) while a worker ran: its next call indexed a twin and
    then was refused its XADD to the change log, so the incident stayed indexed without its change or its alert, and
    the retry, once the right was back, took it for a repeat; without XACK a bad entry was dead-lettered again at each
    retry; without SCARD (sent after the first write) a twin was left half-indexed; without FCALL the worker exited.
    Each stream call, dead letters included, now checks its rights before its first write (fitness.lua); the worker
    names the grant and waits, and the entries are applied in order once it is given back."""
    publish(worker_client, [SPEC_EVENTS[0]])
    log = tmp_path / "worker.log"
    worker = start_worker(worker_url(acl_server), log=log, consumer="acl-worker", **FAST, reconnect_max_backoff_s=0.2)
    try:
        wait_until(lambda: admin.hexists(FP, "47"), 30, "the first incident indexed")
        admin.execute_command("ACL", "SETUSER", WORKER_USER, f"-{taken}")
        try:
            publish(admin, [SPEC_EVENTS[3], SPEC_EVENTS[2]])  # a bad entry, then 90, the twin of 47
            wait_until(lambda: "waiting for the repair" in log.read_text(), 30, "the worker to name the gap")
            time.sleep(0.5)  # more rounds: still nothing written
            assert worker.poll() is None, log.read_text()[-3000:]
            assert not admin.hexists(FP, "90") and admin.xlen(ALERTS) == 0 and admin.xlen("{incidents}:changes") == 1
            assert f"+{taken}" in log.read_text()
        finally:
            admin.execute_command("ACL", "SETUSER", WORKER_USER, f"+{taken}")
        wait_until(lambda: admin.xlen(ALERTS) == 1 and pending_count(admin) == 0, 30, "the alert once given back")
    finally:
        assert stop(worker) == 0, log.read_text()[-3000:]
    assert [(a.incident_id, [(m.incident_id, m.distance) for m in a.matches]) for a in alerts(admin)] == [
        ("90", [("47", 0)])
    ]
    assert sorted(admin.hkeys(FP)) == ["47", "90"] and admin.xlen("{incidents}:changes") == 2
    assert [letter.reason for letter in dead_letters(admin)] == ["bad_json"]


def test_check_capacity_says_when_its_user_may_not_read_the_memory(
    acl_server: RedisServer, admin: redis.Redis, worker_client: redis.Redis
) -> None:
    """`check --capacity` as the worker's user (whose ACL refuses INFO) printed `healthy` and no word of memory."""
    env = clean_env(redis_url=worker_url(acl_server))
    done = run_in_process(["check", "--capacity", "--redis-only"], env)
    assert "memory not checked" not in done.stderr.decode(), "--redis-only asks nothing of memory"
    done = run_in_process(["check", "--capacity"], env)
    assert "warning: memory not checked: Redis refused INFO to this user" in done.stderr.decode()
    admin_env = clean_env(redis_url=f"redis://admin:{PASSWORDS['REDIS_ADMIN_PASSWORD']}@127.0.0.1:{acl_server.port}/0")
    assert "memory not checked" not in run_in_process(["check", "--capacity"], admin_env).stderr.decode()


def test_a_flooded_posting_set_is_sampled_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    """A posting set larger than the per-event budget is sampled with SRANDMEMBER, which users.acl did not grant:
    every event probing a flooded set was refused (good events became poison once a flood passed MAX_CANDIDATES)."""
    index = FingerprintIndex(worker_client, max_candidates=20)
    index.bulk_load([(str(k), k << 16) for k in range(1, 60)])  # 59 incidents sharing band 0's value
    found = index.add_fingerprint("probe", 0)  # its band 0 is that value: the set is past the budget of 20
    assert 0 < len(found) <= 20, "cut at the budget: some of the 59 matches"
    assert refusals(admin) == []


def test_library_api_works_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    index = FingerprintIndex(worker_client)
    assert index.add("47", {"dock": 3, "scanner": 2, "timeout": 1}) == []
    assert index.add("90", {"dock": 3, "scanner": 2, "timeout": 1}) == [("47", 0)]
    assert index.upsert("83", {"weather": 4, "road": 2}) == []
    assert index.matches({"weather": 4, "road": 2}) == [("83", 0)]
    assert index.delete("90") is True
    assert index.get("47") is not None and len(index) == 2
    # exact twins: a group made, its representative deleted (its postings handed on), the group dropped
    assert index.add("91", {"dock": 3, "scanner": 2, "timeout": 1}) == [("47", 0)]
    assert index.add("92", {"dock": 3, "scanner": 2, "timeout": 1}) == [("47", 0), ("91", 0)]
    assert index.delete("47") is True and index.delete("92") is True
    assert index.matches({"dock": 3, "scanner": 2, "timeout": 1}) == [("91", 0)]
    assert index.delete("91") is True and index.add("47", {"dock": 3, "scanner": 2, "timeout": 1}) == []
    assert index.bulk_load([("100", 1), ("101", 2), ("102", 2)]) == 3
    assert refusals(admin) == []
    assert issubclass(NoPermissionError, ResponseError), "stats() relies on catching ResponseError"
    stats = index.stats()
    assert stats["incidents"] == 5 and stats["meta"]["bands"] == "4"
    assert "used_memory" not in stats, "INFO is not granted; if it is now, update this test and the ACL's comment"
    assert {entry.split()[2] for entry in refusals(admin)} <= {"info"}


def test_retention_works_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    # turned on (backfill), kept by the apply step, read by stats and expire --dry-run, an expiry pass, turned off
    from worker import retention

    index = FingerprintIndex(worker_client)
    index.add_fingerprint("old", 1)
    retention.set_window(index, 1)
    assert retention.backfill_step(index) == (False, 1)
    index.add_fingerprint("new", 2)
    time.sleep(0.01)
    assert retention.state(worker_client, index.keys, upcoming=5).due == 2
    assert retention.expire_due(index).expired == 2 and len(index) == 0
    retention.set_window(index, 0)
    assert refusals(admin) == []


def test_migration_works_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    # started, built, switched and its old postings removed; then another started and aborted
    from worker.bands import BandLayout
    from worker.migrate import Migrator

    index = FingerprintIndex(worker_client)
    spread = 0x9E3779B97F4A7C15  # fingerprints far apart
    index.bulk_load([(str(i), i * spread % 2**64) for i in range(50)])
    assert Migrator(worker_client, "incidents", batch=10).migrate(3).startswith("moved from")
    assert index.add_fingerprint("x", spread) == [("1", 0)] and index.layout.bands == 3
    migrator = Migrator(worker_client, "incidents", batch=10)
    stored = FingerprintIndex.stored(worker_client)
    assert stored is not None
    migrator._start(stored, BandLayout(4, 7))
    migrator.step()
    assert migrator.abort().startswith("aborted")
    assert refusals(admin) == []


def test_one_band_index_works_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    # One band probed at radius 0 is the one layout whose query reads a single posting set: SMEMBERS, not SUNION.
    index = FingerprintIndex(worker_client, bands=1, max_distance=0)
    assert index.add("47", {"dock": 3}) == [] and index.add("90", {"dock": 3}) == [("47", 0)]
    assert refusals(admin) == []


def test_operator_reads_and_replays_work_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    # What the operator subcommands send, command by command, so the ACL is held to it even without worker/commands/.
    client = worker_client
    dead = "{incidents}:dead"
    letter = client.xadd(dead, {"reason": "bad_json", "original_incident_id": "1"})
    assert client.xlen(dead) == 1 and client.exists(dead) == 1
    assert client.xrange(dead)[0][0] == letter == client.xrevrange(dead, count=1)[0][0]
    assert client.xread({dead: "0-0"}, count=10)
    # dead replay: re-publish the original and drop the dead letter in one transaction, under WATCH
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(dead)
        assert pipe.xrange(dead, letter, letter)
        pipe.multi()
        pipe.xadd(EVENTS, {"incident_id": "1", "features": json.dumps({"a": 1})})
        pipe.xdel(dead, letter)
        assert pipe.execute()[1] == 1
    with client.pipeline(transaction=True) as pipe:
        pipe.watch(dead)
        pipe.unwatch()
    # the consumer group's housekeeping, as the worker and `alerts --group` do it
    client.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    client.xreadgroup(GROUP, "gone", {EVENTS: ">"}, count=1)
    client.xack(EVENTS, GROUP, client.xpending_range(EVENTS, GROUP, "-", "+", 10)[0]["message_id"])
    assert client.xgroup_delconsumer(EVENTS, GROUP, "gone") == 0
    assert client.xinfo_groups(EVENTS) and client.xinfo_consumers(EVENTS, GROUP) == []
    # inspect: posting set sizes and membership
    FingerprintIndex(client).add("1", {"a": 1})
    posting = FingerprintIndex(client).posting_keys(fingerprint({"a": 1}))[0]
    assert client.scard(posting) == 1 and client.sismember(posting, "1")
    # the heartbeat and the registry of workers, and `check` and `stats` finding it there (no SCAN)
    client.set("{incidents}:heartbeat:probe", "{}", px=5000)
    client.zadd("{incidents}:workers", {"probe": 5000})
    client.zremrangebyscore("{incidents}:workers", "-inf", 0)
    assert client.execute_command("ZRANGE", "{incidents}:workers", 0, 999, "REV") == [b"probe"]
    assert client.mget(["{incidents}:heartbeat:probe"]) == [b"{}"]
    assert client.delete("{incidents}:heartbeat:probe") == 1
    assert client.zrem("{incidents}:workers", "probe") == 1
    assert refusals(admin) == []


OPERATOR_COMMANDS = ("publish", "query", "inspect", "stats", "alerts", "dead", "check")


@pytest.mark.slow
def test_operator_subcommands_work_as_the_acl_user(
    acl_server: RedisServer, admin: redis.Redis, worker_client: redis.Redis, tmp_path: Path
) -> None:
    missing = [name for name in OPERATOR_COMMANDS if not _has_subcommand(name)]
    assert not missing, f"incident-worker has no {', '.join(missing)}"
    env = clean_env(redis_url=worker_url(acl_server), log_format="json")

    def cli(*args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [*worker_command(), *args], env=env, input=stdin, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"incident-worker {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    valid = [event for event in SPEC_EVENTS if not isinstance(event.get("features"), str)]
    cli("publish", "-", stdin="".join(json.dumps(event) + "\n" for event in valid))
    publish(worker_client, [event for event in SPEC_EVENTS if isinstance(event.get("features"), str)])
    worker = start_worker(worker_url(acl_server), "--until-idle", log=tmp_path / "w.log", **FAST)
    assert worker.wait(timeout=60) == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert '"47"' in cli("query", "--features", json.dumps(SPEC_EVENTS[0]["features"]), "--json")
    assert '"47"' in cli("inspect", "47", "--json")
    cli("stats", "--json")
    assert len(cli("alerts", "--since", "0", "--json").splitlines()) == 2
    assert len(cli("alerts", "--group", "pager", "--from-start", "--count", "5", "--json").splitlines()) == 2
    assert len(cli("dead", "--json").splitlines()) == 2
    events = admin.xlen(EVENTS)
    cli("dead", "replay", "--reason", "bad_json")
    assert admin.xlen(EVENTS) == events + 1 and admin.xlen("{incidents}:dead") == 1
    cli("check", "--redis-only")
    assert {entry.split()[2] for entry in refusals(admin)} <= {"info"}, refusals(admin)


OUTSIDE: dict[str, Callable[[redis.Redis], Any]] = {
    "SET a key without the tag": lambda c: c.set("other", "1"),
    "GET a key without the tag": lambda c: c.mget(["other"]),
    "GETDEL, which no part of the worker uses": lambda c: c.getdel("{incidents}:heartbeat:x"),
    "HSET another namespace": lambda c: c.hset("{other}:fp", "1", "0" * 16),
    "HGET another namespace": lambda c: c.hget("{other}:fp", "1"),
    "XADD another namespace": lambda c: c.xadd("{other}:events", {"incident_id": "1"}),
    "FLUSHALL": lambda c: c.flushall(),
    "FLUSHDB": lambda c: c.flushdb(),
    "CONFIG GET": lambda c: c.config_get("*"),
    "CONFIG SET": lambda c: c.config_set("appendonly", "no"),
    "KEYS": lambda c: c.keys("*"),
    "FUNCTION LOAD": lambda c: c.function_load(PROBE_LIBRARY),
    "FUNCTION LOAD REPLACE of the index's own library": lambda c: c.function_load(library.LIBRARY_SOURCE, replace=True),
    "FUNCTION RESTORE": lambda c: c.function_restore(b"x", "REPLACE"),
    "SCRIPT LOAD": lambda c: c.script_load("return 1"),
    "FUNCTION FLUSH": lambda c: c.function_flush(),
    "FUNCTION DELETE": lambda c: c.function_delete("incident_index"),
    "EVAL": lambda c: c.eval("return 1", 0),
    "ACL LIST": lambda c: c.acl_list(),
    "INFO": lambda c: c.info(),
    "SELECT": lambda c: c.execute_command("SELECT", 1),
    "PUBLISH": lambda c: c.publish("incidents", "x"),
    "index of another namespace": lambda c: FingerprintIndex(c, namespace="other").add("1", {"a": 1}),
}


@pytest.mark.parametrize("attempt", list(OUTSIDE), ids=list(OUTSIDE))
def test_acl_user_is_refused_outside_its_namespace(attempt: str, worker_client: redis.Redis) -> None:
    with pytest.raises(NoPermissionError):
        OUTSIDE[attempt](worker_client)


PROBE_LIBRARY = """#!lua name=acl_probe
redis.register_function('acl_probe_key', function() return redis.call('HGET', '{other}:fp', '1') end)
redis.register_function('acl_probe_command', function() return redis.call('FLUSHALL') end)
"""


def test_functions_run_with_the_callers_permissions(admin: redis.Redis, worker_client: redis.Redis) -> None:
    # Code an admin loaded still runs as its caller: a function cannot take the worker outside its namespace.
    admin.function_load(PROBE_LIBRARY)
    with pytest.raises(ResponseError, match="can't access at least one of the keys"):
        worker_client.fcall("acl_probe_key", 0)
    with pytest.raises(ResponseError, match="can't run this command"):
        worker_client.fcall("acl_probe_command", 0)


# -- every user: what its role needs, and nothing else -----------------------------------------------------------

ALERTS_STREAM = "{incidents}:alerts"
DEAD_STREAM = "{incidents}:dead"
EVENT = {"incident_id": "7", "features": json.dumps({"a": 1})}


def _fcall_neighbours(c: redis.Redis) -> Any:
    return FingerprintIndex(c).matches({"a": 1})


INBOX = "{incidents}:inbox"


def _fcall_intake(c: redis.Redis) -> Any:
    target = library.StreamTarget(EVENTS, ALERTS_STREAM, DEAD_STREAM, GROUP)
    return inbox.intake(c, INBOX, target, Settings(), "producer")


def _own_group_read(c: redis.Redis) -> Any:
    c.xgroup_create(ALERTS_STREAM, "oncall", id="0", mkstream=True)
    return c.xreadgroup("oncall", "oncall-1", {ALERTS_STREAM: ">"}, count=10)


ROLES: list[tuple[str, str, Callable[[redis.Redis], Any], bool]] = [
    # (user, what, the call, allowed)
    (PRODUCER_USER, "RPUSH an encoded event to the inbox", lambda c: c.rpush(INBOX, inbox.encode(EVENT)), True),
    (PRODUCER_USER, "FCALL submit (the library's checked append)", lambda c: inbox.submit(c, INBOX, EVENT, 1024), True),
    (PRODUCER_USER, "PING", lambda c: c.ping(), True),
    (PRODUCER_USER, "XADD an event", lambda c: c.xadd(EVENTS, EVENT), False),
    (PRODUCER_USER, "XADD MAXLEN 0 (the stream emptied)", lambda c: c.xadd(EVENTS, EVENT, maxlen=0), False),
    (PRODUCER_USER, "XADD the largest ID", lambda c: c.xadd(EVENTS, EVENT, id=f"{2**64 - 1}-{2**64 - 1}"), False),
    (PRODUCER_USER, "LPOP the inbox", lambda c: c.lpop(INBOX), False),
    (PRODUCER_USER, "RPOP the inbox", lambda c: c.rpop(INBOX), False),
    (PRODUCER_USER, "LRANGE the inbox (others' events)", lambda c: c.lrange(INBOX, 0, -1), False),
    (PRODUCER_USER, "LTRIM the inbox", lambda c: c.ltrim(INBOX, 1, 0), False),
    (PRODUCER_USER, "LPUSH to the inbox (ahead of others)", lambda c: c.lpush(INBOX, inbox.encode(EVENT)), False),
    (PRODUCER_USER, "LSET an inbox entry", lambda c: c.lset(INBOX, 0, inbox.encode(EVENT)), False),
    (PRODUCER_USER, "LREM inbox entries", lambda c: c.lrem(INBOX, 0, b"x"), False),
    (PRODUCER_USER, "DEL the inbox", lambda c: c.delete(INBOX), False),
    (PRODUCER_USER, "RENAME the inbox", lambda c: c.rename(INBOX, "{incidents}:x"), False),
    (PRODUCER_USER, "RPUSH to another key", lambda c: c.rpush("{incidents}:fp", b"x"), False),
    (PRODUCER_USER, "FCALL intake (the workers' move)", _fcall_intake, False),
    (PRODUCER_USER, "CLIENT SETNAME", lambda c: c.client_setname("publisher"), True),
    (PRODUCER_USER, "XADD a forged alert", lambda c: c.xadd(ALERTS_STREAM, {"incident_id": "x"}), False),
    (PRODUCER_USER, "XADD to another namespace", lambda c: c.xadd("{other}:events", EVENT), False),
    (PRODUCER_USER, "XADD to a key without the tag", lambda c: c.xadd("events", EVENT), False),
    (PRODUCER_USER, "XRANGE the events (others' incidents)", lambda c: c.xrange(EVENTS), False),
    (PRODUCER_USER, "XREAD the events", lambda c: c.xread({EVENTS: "0"}), False),
    (PRODUCER_USER, "XLEN the events", lambda c: c.xlen(EVENTS), False),
    (PRODUCER_USER, "XDEL an event", lambda c: c.xdel(EVENTS, "0-1"), False),
    (PRODUCER_USER, "XTRIM the events", lambda c: c.xtrim(EVENTS, maxlen=0), False),
    (PRODUCER_USER, "DEL the events", lambda c: c.delete(EVENTS), False),
    (PRODUCER_USER, "XREADGROUP as the workers", lambda c: c.xreadgroup(GROUP, "x", {EVENTS: ">"}), False),
    (PRODUCER_USER, "XGROUP DESTROY the workers' group", lambda c: c.xgroup_destroy(EVENTS, GROUP), False),
    (PRODUCER_USER, "XGROUP SETID the workers' group", lambda c: c.xgroup_setid(EVENTS, GROUP, "$"), False),
    (PRODUCER_USER, "XRANGE the alerts", lambda c: c.xrange(ALERTS_STREAM), False),
    (PRODUCER_USER, "HGETALL the index", lambda c: c.hgetall(FP), False),
    (PRODUCER_USER, "FCALL the index", _fcall_neighbours, False),
    (PRODUCER_USER, "FUNCTION LOAD", lambda c: c.function_load(PROBE_LIBRARY), False),
    (PRODUCER_USER, "EVAL", lambda c: c.eval("return 1", 0), False),
    (PRODUCER_USER, "KEYS", lambda c: c.keys("*"), False),
    (PRODUCER_USER, "SCAN", lambda c: c.scan(0), False),
    (PRODUCER_USER, "INFO", lambda c: c.info(), False),
    (PRODUCER_USER, "FLUSHALL", lambda c: c.flushall(), False),
    (SUBSCRIBER_USER, "XRANGE the alerts", lambda c: c.xrange(ALERTS_STREAM), True),
    (SUBSCRIBER_USER, "XREVRANGE the alerts", lambda c: c.xrevrange(ALERTS_STREAM, count=1), True),
    (SUBSCRIBER_USER, "XREAD the alerts", lambda c: c.xread({ALERTS_STREAM: "0"}, count=1), True),
    (SUBSCRIBER_USER, "XGROUP CREATE and XREADGROUP, its own group", _own_group_read, True),
    (SUBSCRIBER_USER, "XACK in its group", lambda c: c.xack(ALERTS_STREAM, "pager", "0-1"), True),
    (SUBSCRIBER_USER, "XPENDING of its group", lambda c: c.xpending(ALERTS_STREAM, "pager"), True),
    (SUBSCRIBER_USER, "XAUTOCLAIM in its group", lambda c: c.xautoclaim(ALERTS_STREAM, "pager", "b", 0), True),
    (SUBSCRIBER_USER, "XCLAIM in its group", lambda c: c.xclaim(ALERTS_STREAM, "pager", "b", 0, ["0-1"]), True),
    (SUBSCRIBER_USER, "PING", lambda c: c.ping(), True),
    (SUBSCRIBER_USER, "XADD a forged alert", lambda c: c.xadd(ALERTS_STREAM, {"incident_id": "x"}), False),
    (SUBSCRIBER_USER, "XDEL an alert", lambda c: c.xdel(ALERTS_STREAM, "0-1"), False),
    (SUBSCRIBER_USER, "XTRIM the alerts", lambda c: c.xtrim(ALERTS_STREAM, maxlen=0), False),
    (SUBSCRIBER_USER, "DEL the alerts", lambda c: c.delete(ALERTS_STREAM), False),
    (SUBSCRIBER_USER, "XGROUP DESTROY a group", lambda c: c.xgroup_destroy(ALERTS_STREAM, "pager"), False),
    (SUBSCRIBER_USER, "XGROUP SETID a group", lambda c: c.xgroup_setid(ALERTS_STREAM, "pager", "0"), False),
    (SUBSCRIBER_USER, "XADD an event", lambda c: c.xadd(EVENTS, EVENT), False),
    (SUBSCRIBER_USER, "XRANGE the events", lambda c: c.xrange(EVENTS), False),
    (SUBSCRIBER_USER, "XREADGROUP the events as the workers", lambda c: c.xreadgroup(GROUP, "x", {EVENTS: ">"}), False),
    (SUBSCRIBER_USER, "XRANGE the dead letters", lambda c: c.xrange(DEAD_STREAM), False),
    (SUBSCRIBER_USER, "XRANGE another namespace's alerts", lambda c: c.xrange("{other}:alerts"), False),
    (SUBSCRIBER_USER, "HGETALL the index", lambda c: c.hgetall(FP), False),
    (SUBSCRIBER_USER, "FCALL the index", _fcall_neighbours, False),
    (SUBSCRIBER_USER, "FUNCTION LOAD", lambda c: c.function_load(PROBE_LIBRARY), False),
    (SUBSCRIBER_USER, "KEYS", lambda c: c.keys("*"), False),
    (SUBSCRIBER_USER, "FLUSHALL", lambda c: c.flushall(), False),
    (WORKER_USER, "FCALL the index", _fcall_neighbours, True),
    (WORKER_USER, "XADD an event", lambda c: c.xadd(EVENTS, EVENT), True),
    (WORKER_USER, "FCALL intake (move the inbox)", _fcall_intake, True),
    (WORKER_USER, "XREADGROUP the events", lambda c: c.xreadgroup(GROUP, "w", {EVENTS: ">"}, count=1), True),
    (WORKER_USER, "MEMORY USAGE of its alerts (their memory budget)", lambda c: c.memory_usage(ALERTS_STREAM, 0), True),
    (WORKER_USER, "XTRIM its alerts", lambda c: c.xtrim(ALERTS_STREAM, maxlen=10, approximate=True), True),
    (WORKER_USER, "MEMORY USAGE of another namespace", lambda c: c.memory_usage("{other}:fp"), False),
    (WORKER_USER, "FUNCTION LOAD", lambda c: c.function_load(PROBE_LIBRARY), False),
    (WORKER_USER, "FUNCTION LOAD REPLACE", lambda c: c.function_load(library.LIBRARY_SOURCE, replace=True), False),
    (WORKER_USER, "FUNCTION DELETE", lambda c: c.function_delete(library.LIBRARY_NAME), False),
    (WORKER_USER, "FUNCTION FLUSH", lambda c: c.function_flush(), False),
    (WORKER_USER, "FUNCTION RESTORE", lambda c: c.function_restore(b"x", "REPLACE"), False),
    (WORKER_USER, "FUNCTION LIST (other applications' code)", lambda c: c.function_list(withcode=True), False),
    (WORKER_USER, "EVAL", lambda c: c.eval("return 1", 0), False),
    (WORKER_USER, "SCRIPT LOAD", lambda c: c.script_load("return 1"), False),
    (WORKER_USER, "HGET another namespace", lambda c: c.hget("{other}:fp", "1"), False),
    (WORKER_USER, "SET a key without the tag", lambda c: c.set("other", "1"), False),
    ("admin", "FUNCTION LOAD REPLACE", lambda c: c.function_load(library.LIBRARY_SOURCE, replace=True), True),
]


@pytest.fixture
def role_clients(acl_server: RedisServer, admin: redis.Redis) -> Iterator[dict[str, redis.Redis]]:
    """A client of every user, on a server holding the library, an event with its group, and an alert."""
    admin.xgroup_create(EVENTS, GROUP, id="0", mkstream=True)
    admin.xadd(EVENTS, EVENT)
    admin.xadd(ALERTS_STREAM, {"incident_id": "7", "matches": "[]"})
    admin.xgroup_create(ALERTS_STREAM, "pager", id="0")
    once = {"retry": Retry(NoBackoff(), 0)}
    clients = {
        user: acl_server.client(username=user, password=PASSWORDS[variable], **once)
        for user, variable in USER_PASSWORDS.items()
    }
    yield clients
    for client in clients.values():
        client.close()


@pytest.mark.parametrize(
    ("user", "what", "call", "allowed"),
    ROLES,
    ids=[f"{user}: {'may' if allowed else 'may not'} {what}" for user, what, _, allowed in ROLES],
)
def test_each_user_may_do_what_its_role_needs_and_nothing_else(
    role_clients: dict[str, redis.Redis],
    admin: redis.Redis,
    user: str,
    what: str,
    call: Callable[[redis.Redis], Any],
    allowed: bool,
) -> None:
    admin.acl_log_reset()
    if allowed:
        call(role_clients[user])
        assert refusals(admin) == [], f"{user} was refused part of {what}"
    else:
        with pytest.raises(NoPermissionError):
            call(role_clients[user])
        assert admin.function_list(library="acl_probe") == [], "code was loaded"


def test_every_user_of_the_template_is_in_the_table(tmp_path: Path) -> None:
    users = set(_rendered_rules(tmp_path)) - {"default"}
    assert users == {user for user, *_ in ROLES}
    for user in users - {"admin"}:
        refused = {what for who, what, _, allowed in ROLES if who == user and not allowed}
        assert "FUNCTION LOAD" in refused, f"{user} is not shown to be refused FUNCTION LOAD"


def test_producer_and_subscriber_run_their_subcommands(
    acl_server: RedisServer, admin: redis.Redis, tmp_path: Path
) -> None:
    def url(user: str) -> str:
        return f"redis://{user}:{PASSWORDS[USER_PASSWORDS[user]]}@127.0.0.1:{acl_server.port}/0"

    def cli(user: str, *args: str, stdin: str | None = None) -> str:
        env = clean_env(redis_url=url(user), log_format="json")
        result = run_in_process(args, env, stdin.encode() if stdin is not None else None)
        output = result.stdout.decode() + result.stderr.decode()
        assert result.returncode == 0, f"{user}: incident-worker {' '.join(args)}: {output}"
        return result.stdout.decode()

    valid = [event for event in SPEC_EVENTS if not isinstance(event.get("features"), str)]
    cli(PRODUCER_USER, "publish", "--inbox", "-", stdin="".join(json.dumps(event) + "\n" for event in valid))
    assert admin.llen(INBOX) == len(valid)
    worker = start_worker(url(WORKER_USER), "--until-idle", log=tmp_path / "w.log", **FAST)
    assert worker.wait(timeout=60) == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert len(cli(SUBSCRIBER_USER, "alerts", "--since", "0", "--json").splitlines()) == 2
    assert len(cli(SUBSCRIBER_USER, "alerts", "--count", "1", "--json").splitlines()) == 1
    grouped = cli(SUBSCRIBER_USER, "alerts", "--group", "pager", "--from-start", "--count", "5", "--json")
    assert len(grouped.splitlines()) == 2
    assert refusals(admin) == []


@pytest.mark.parametrize(
    ("user", "args", "key"),
    [
        (WORKER_USER, ("stats",), ALERTS_STREAM),
        (WORKER_USER, ("dead",), DEAD_STREAM),
        (SUBSCRIBER_USER, ("alerts", "--since", "0"), ALERTS_STREAM),
        (PRODUCER_USER, ("publish", "--inbox", "-"), INBOX),
    ],
    ids=["worker: stats", "worker: dead", "subscriber: alerts", "producer: publish"],
)
def test_a_key_of_another_type_is_named_to_each_user_without_refusals(
    acl_server: RedisServer, admin: redis.Redis, user: str, args: tuple[str, ...], key: str
) -> None:
    """A stream key of another type is named with what it holds, as far as the user may ask (TYPE is granted to the
    worker's and the subscriber's users; the producer's key access is write-only), and finding it costs no refusal
    in the ACL log: `alerts` asks only about the alerts stream, the one key its user may read."""
    admin.set(key, "by hand")
    url = f"redis://{user}:{PASSWORDS[USER_PASSWORDS[user]]}@127.0.0.1:{acl_server.port}/0"
    stdin = json.dumps({"incident_id": "1", "features": {"a": 1}}) + "\n"
    env = clean_env(redis_url=url)
    done = run_in_process(args, env, stdin.encode())
    result = subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())
    assert result.returncode == 2, result.stdout + result.stderr
    held = "holds another type than the list" if user == PRODUCER_USER else "holds a string, not the stream"
    assert f"{key} {held} the index keeps there" in result.stderr, result.stderr
    assert "WRONGTYPE Operation" not in result.stderr
    assert [entry for entry in refusals(admin) if user != PRODUCER_USER or "type" not in entry] == []


def test_load_functions_needs_the_admin(acl_server: RedisServer, admin: redis.Redis) -> None:
    admin.function_flush()
    as_worker = subprocess.run(
        [*worker_command(), "load-functions", "--admin-redis-url", worker_url(acl_server)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert as_worker.returncode == 1 and "Traceback" not in as_worker.stderr
    assert "NOPERM" in as_worker.stderr or "permission" in as_worker.stderr
    assert PASSWORDS["REDIS_WORKER_PASSWORD"] not in as_worker.stderr
    assert admin.function_list() == []
    admin_url = f"redis://admin:{PASSWORDS['REDIS_ADMIN_PASSWORD']}@127.0.0.1:{acl_server.port}/0"
    loaded = subprocess.run(
        [*worker_command(), "load-functions", "--json"],
        env=clean_env(redis_url=worker_url(acl_server), admin_redis_url=admin_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    report = json.loads(loaded.stdout)
    assert report["loaded"] == library.LIBRARY_NAME and report["redis"].startswith("redis://admin:***@")
    assert PASSWORDS["REDIS_ADMIN_PASSWORD"] not in loaded.stdout + loaded.stderr
    assert library.installed_versions(admin) == [library.LIBRARY_NAME]


def test_default_user_and_wrong_passwords_are_refused(acl_server: RedisServer, admin: redis.Redis) -> None:
    once = {"retry": Retry(NoBackoff(), 0)}  # redis-py retries a refused login like a dropped connection
    with acl_server.client(**once) as anonymous, pytest.raises(AuthenticationError):
        anonymous.ping()
    with acl_server.client(username=WORKER_USER, password="wrong", **once) as wrong, pytest.raises(AuthenticationError):
        wrong.ping()
    with acl_server.client(username="default", password="", **once) as default, pytest.raises(AuthenticationError):
        default.ping()
    assert admin.acl_whoami() == "admin"


def test_redis_refuses_the_unrendered_template(tmp_path: Path) -> None:
    # Fails closed: started on the template by mistake, Redis does not start at all (with a password "${...}").
    require_redis_server()
    command = ["redis-server", "--port", str(free_port()), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)]
    result = subprocess.run([*command, "--aclfile", str(ACL_TEMPLATE)], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "ACL errors" in result.stdout + result.stderr


def _has_subcommand(name: str) -> bool:
    parser = build_parser()
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return any(name in action.choices for action in actions)


@pytest.mark.slow
def test_check_works_as_the_acl_user(acl_server: RedisServer, admin: redis.Redis, tmp_path: Path) -> None:
    assert _has_subcommand("check"), "incident-worker has no check"
    url = worker_url(acl_server)
    env = clean_env(redis_url=url, consumer="probed", log_format="json")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        command = [*worker_command(), "check", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    redis_only = check("--redis-only")
    assert redis_only.returncode == 0, redis_only.stdout + redis_only.stderr
    worker = start_worker(url, log=tmp_path / "w.log", consumer="probed", **FAST)
    try:
        deadline = time.monotonic() + 20
        while worker.poll() is None and time.monotonic() < deadline:
            if admin.exists("{incidents}:heartbeat:probed"):
                break
            time.sleep(0.05)
        result = check()
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        assert stop(worker) == 0
    assert check().returncode == 1, "check passes with no heartbeat"
    assert refusals(admin) == []


def test_check_functions_waits_as_the_worker_user_until_the_admin_loads_them(
    acl_server: RedisServer, admin: redis.Redis
) -> None:
    """The init container's command: as the worker's user, unhealthy without this version's library (saying what to
    run), and with --wait it returns 0 within one step of the admin's load-functions."""
    env = clean_env(redis_url=worker_url(acl_server))
    command = [*worker_command(), "check", "--functions"]
    assert subprocess.run(command, env=env, capture_output=True, timeout=60).returncode == 0
    admin.function_delete(library.LIBRARY_NAME)
    try:
        missing = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert missing.returncode == 1 and "load-functions" in missing.stderr, missing.stderr
        waiting = subprocess.Popen([*command, "--wait", "60"], env=env, stderr=subprocess.PIPE, text=True)
        assert waiting.stderr is not None
        with waiting.stderr:
            # its first line says it waits (read before loading: a slow start under load must not miss the wait)
            assert "waiting up to 60 s" in waiting.stderr.readline()
            time.sleep(2)
            assert waiting.poll() is None, "it stopped waiting while the library is missing"
            library.load(admin)
            started = time.monotonic()
            assert waiting.wait(timeout=30) == 0
            assert time.monotonic() - started < 10
        assert subprocess.run([*command, "--wait", "0.5"], env=env, capture_output=True, timeout=60).returncode == 0
    finally:
        library.load(admin)
    assert refusals(admin) == []


# -- redis.conf on a real redis-server ------------------------------------------------------------------------


class ConfiguredRedis(RedisServer):
    """redis-server started on a config file, only port, address and log file overridden on the command line."""

    def __init__(self, directory: Path, conf: Path) -> None:
        super().__init__(directory)
        self.conf = conf

    def command(self) -> list[str]:
        log = self.directory / "redis.log"
        return ["redis-server", str(self.conf), "--port", str(self.port), "--bind", "127.0.0.1", "--logfile", str(log)]


def shipped_redis(directory: Path) -> ConfiguredRedis:
    """A redis-server (not started) on the shipped redis.conf and the rendered users.acl, its data in `directory`."""
    require_redis_server()
    acl = directory / "users.acl"
    assert render_acl(acl).returncode == 0
    text = REDIS_CONF.read_text()
    text, dirs = re.subn(r"(?m)^dir .*$", f"dir {directory}", text)
    text, aclfiles = re.subn(r"(?m)^aclfile .*$", f"aclfile {acl}", text)
    assert (dirs, aclfiles) == (1, 1), "redis.conf should name its data directory and its ACL file once each"
    conf = directory / "redis.conf"
    conf.write_text(text)
    return ConfiguredRedis(directory, conf)


def test_redis_conf_is_accepted_by_redis_7_with_aof_and_the_acl(tmp_path: Path) -> None:
    acl = tmp_path / "users.acl"
    server = shipped_redis(tmp_path)
    server.start()
    try:
        with server.client(username="admin", password=PASSWORDS["REDIS_ADMIN_PASSWORD"], decode_responses=True) as c:
            assert c.config_get("appendonly") == {"appendonly": "yes"}
            assert c.config_get("appendfsync") == {"appendfsync": "everysec"}
            assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert c.config_get("aclfile") == {"aclfile": str(acl)}
            assert c.config_get("save") == {"save": ""}
            assert WORKER_USER in c.acl_users()
            library.load(c)
        with server.client(username=WORKER_USER, password=PASSWORDS["REDIS_WORKER_PASSWORD"]) as worker:
            assert worker.ping()
            # 1,000 incidents sharing band 0's value: their posting set stays an intset (Redis's default, 512,
            # would make it a hash table of about 50 bytes a member)
            FingerprintIndex(worker).bulk_load([(str(k), k << 16) for k in range(1, 1001)])
            assert worker.scard("{incidents}:band:0:0000") == 1000
        with server.client(username="admin", password=PASSWORDS["REDIS_ADMIN_PASSWORD"]) as c:
            assert c.object("encoding", "{incidents}:band:0:0000") == b"intset"
        with server.client(retry=Retry(NoBackoff(), 0)) as anonymous, pytest.raises(AuthenticationError):
            anonymous.ping()
        assert (tmp_path / "appendonlydir").is_dir(), "no append-only file was started"
    finally:
        server.stop()


def test_a_restart_of_the_shipped_redis_keeps_what_the_worker_wrote(tmp_path: Path) -> None:
    """The append-only file holds each function call as MULTI/EXEC, and Redis 7.0 to 7.4 check an EXEC read back
    from it against the default user's rights (redis/redis#14541): with no rights there, every call of the worker
    was refused at load and a restart came back with an empty index and no alerts."""
    server = shipped_redis(tmp_path)
    server.start()
    admin_login = {"username": "admin", "password": PASSWORDS["REDIS_ADMIN_PASSWORD"], "decode_responses": True}
    try:
        with server.client(**admin_login) as c:
            library.load(c)
        worker = start_worker(worker_url(server), "--until-idle", log=tmp_path / "worker.log", **FAST)
        with server.client(username=WORKER_USER, password=PASSWORDS["REDIS_WORKER_PASSWORD"]) as client:
            publish(client, SPEC_EVENTS)
        assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-3000:]
        with server.client(**admin_login) as c:
            before = (c.hgetall(FP), c.xlen(ALERTS), c.xlen("{incidents}:changes"), pending_count(c))
        assert before[0] and before[1] == 2 and before[3] == 0
    finally:
        server.stop()  # SIGTERM: Redis syncs its append-only file and exits
    server.start()
    try:
        with server.client(**admin_login) as c:
            after = (c.hgetall(FP), c.xlen(ALERTS), c.xlen("{incidents}:changes"), pending_count(c))
        assert after == before
        log = (tmp_path / "redis.log").read_text()
        assert "NOPERM" not in log, log[-2000:]
        with server.client(**admin_login) as c:  # and the default user still lets nobody in
            acl = {entry.split()[1]: entry for entry in c.acl_list()}
            assert " off " in acl["default"] and "nopass" not in acl["default"]
        with server.client(retry=Retry(NoBackoff(), 0)) as anonymous, pytest.raises(AuthenticationError):
            anonymous.ping()
    finally:
        server.stop()


def test_servers_the_tests_and_benchmarks_start_run_with_the_shipped_redis_conf_settings() -> None:
    """A benchmark's figures (memory an incident above all) are those of the Redis the project ships."""
    from worker.devtools.redis_server import SHIPPED_SETTINGS

    conf = dict(line.split(None, 1) for line in REDIS_CONF.read_text().splitlines() if line.strip() and line[0] != "#")
    names = SHIPPED_SETTINGS[::2]
    assert all(name.startswith("--") for name in names)
    assert {name[2:]: conf.get(name[2:]) for name in names} == dict(
        zip([name[2:] for name in names], SHIPPED_SETTINGS[1::2], strict=True)
    )
    assert "set-max-intset-entries" in conf
    assert list(SHIPPED_SETTINGS) == RedisServer(Path("/nonexistent")).command()[-len(SHIPPED_SETTINGS) :]


def test_worker_pods_wait_for_the_functions_in_an_init_container() -> None:
    """Pods started before the load-functions Job wait for the library instead of crash-looping with backoff."""
    documents = kubernetes_documents()
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    worker = worker_container(documents)
    assert init["image"] == worker["image"]
    args = init["args"]
    assert args[:2] == ["check", "--functions"] and float(args[args.index("--wait") + 1]) >= 60
    assert init["envFrom"] == worker["envFrom"], "it must ask as the worker's user, with the worker's settings"
    assert "incident-worker-admin-redis" not in json.dumps(init), "the admin's Secret is the Job's alone"
    assert init["securityContext"] == worker["securityContext"]
    assert {"cpu", "memory"} <= set(init["resources"]["limits"])
    from worker.cli import build_parser

    parsed = build_parser("check").parse_args(["check", *args[1:]])
    assert parsed.functions and parsed.wait >= 60


def test_verify_and_repair_work_as_the_acl_user(admin: redis.Redis, worker_client: redis.Redis) -> None:
    from worker.integrity import Verifier

    index = FingerprintIndex(worker_client)
    index.bulk_load([("1", 1), ("2", 2), ("3", 2), ("4", 1 << 40)])
    admin.sadd("{incidents}:band:0:0009", "ghost")
    admin.zadd("{incidents}:twins:" + "0" * 15 + "1", {"1": 0})
    admin.hset("{incidents}:meta", "retention_ms", "60000")
    admin.zadd("{incidents}:expiry", {"1": 1, "2": 1, "3": 1, "gone": 1})
    found = Verifier(worker_client, "incidents").run()
    assert set(found.counts) == {"orphan_posting", "small_group", "expiry_missing", "expiry_orphan"}
    assert Verifier(worker_client, "incidents", repair=True).run().clean
    assert Verifier(worker_client, "incidents").run().counts == {}
    assert refusals(admin) == []
