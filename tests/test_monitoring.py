"""The monitoring that ships with the worker: alert rules (deploy/prometheus), the dashboard (deploy/grafana), the
compose `monitoring` profile and the runbooks (docs/runbooks.md), held to the metrics the worker really exports."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tests.conftest import require_promtool
from tests.redis_server import RedisServer
from worker import library
from worker.formats import REASONS
from worker.index import FingerprintIndex
from worker.metrics import Metrics
from worker.settings import Settings
from worker.upkeep import STREAM_LABELS, Upkeep

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
COMPOSE = ROOT / "docker-compose.yml"

TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every scraped series."""

EXTERNAL = {
    "up": set(),
    # redis_exporter's names, for the one rule the worker cannot serve (its Redis user may not read INFO)
    "redis_memory_used_bytes": set(),
    "redis_memory_max_bytes": set(),
}
"""Series the rules and the dashboard may query that the worker does not export, with their labels beyond the
target's; alerts.yml's header says where they come from."""


def exported() -> dict[str, set[str]]:
    """Every series name a worker's /metrics shows, with its labels: Metrics' own registry, collected, each labelled
    metric given one child so that its series appear."""
    metrics = Metrics()
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase) and metric._labelnames:
            metric.labels(*["x"] * len(metric._labelnames))
    series: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


# -- PromQL, as far as these files use it ----------------------------------------------------------------------

_AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "group"}
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
_TOKEN = re.compile(
    r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<brace>\{[^}]*\})|(?P<dur>\d+(?:ms|[smhdwy])\b)"""
    r"""|(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?)|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>[^\s]))"""
)
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


def selectors(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str]]:
    """The metric selectors of a PromQL expression, each (name, [(label, op, value)]), and the labels its
    by/without/on/ignoring/group_left/group_right clauses name."""
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range and subquery durations, Grafana's $__rate_interval
    tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in _TOKEN.finditer(expr) if m.lastgroup]
    found: list[tuple[str, list[tuple[str, str, str]]]] = []
    grouping: set[str] = set()
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "ident" and value in _GROUPING:
            if following[1] == "(":
                i += 2
                while i < len(tokens) and tokens[i][1] != ")":
                    if tokens[i][0] == "ident":
                        grouping.add(tokens[i][1])
                    i += 1
        elif kind == "ident" and value not in _AGGREGATIONS | _KEYWORDS and following[1] != "(":
            matchers: list[tuple[str, str, str]] = []
            if following[0] == "brace":
                body = following[1][1:-1]
                matchers = _MATCHER.findall(body)
                assert "".join(m.group(0) for m in _MATCHER.finditer(body)).strip() == body.strip(), body
                i += 1
            found.append((value, matchers))
        i += 1
    return found, grouping


def check_expr(expr: str, known: dict[str, set[str]]) -> list[str]:
    """What is wrong with `expr`'s metrics and labels against `known` (name -> labels beyond the target's)."""
    problems: list[str] = []
    found, grouping = selectors(expr)
    if not found and not re.fullmatch(r"vector\(\d+\)", expr.strip()):  # a constant: the expected workers
        problems.append(f"no metric in {expr!r}")
    available = set(TARGET_LABELS)
    for name, matchers in found:
        if name not in known:
            problems.append(f"{name} is not a series the worker exports (nor one of {sorted(EXTERNAL)})")
            continue
        labels = known[name] | TARGET_LABELS
        available |= labels
        for label, op, value in matchers:
            if label not in labels:
                problems.append(f"{name} has no label {label!r} (it has {sorted(labels)})")
            values = value.split("|") if op in {"=~", "!~"} else [value]
            allowed = {"reason": set(REASONS), "stream": set(STREAM_LABELS.values())}.get(label)
            if allowed is not None and not set(values) <= allowed:
                problems.append(f"{name}{{{label}{op}{value!r}}}: {sorted(set(values) - allowed)} never exported")
    for label in grouping - available:
        problems.append(f"{expr!r} groups by {label!r}, a label none of its series has")
    return problems


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def known_series() -> dict[str, set[str]]:
    recorded = {rule["record"]: set() for rule in rules() if "record" in rule}
    return {**exported(), **EXTERNAL, **recorded}


def dashboard_targets(path: Path) -> list[dict[str, Any]]:
    board = json.loads(path.read_text())
    panels = [p for top in board["panels"] for p in [top, *top.get("panels", [])]]
    return [target for panel in panels for target in panel.get("targets", [])]


# -- the metric names and labels -------------------------------------------------------------------------------


def test_the_exported_set_comes_from_the_registry_with_labels() -> None:
    series = exported()
    assert series["incident_worker_events_total"] == {"outcome"}
    assert series["incident_worker_dead_letters_total"] == {"reason"}
    assert series["incident_worker_end_to_end_seconds_bucket"] == {"le"}
    assert series["incident_worker_stream_memory_bytes"] == {"stream"}
    assert "incident_worker_snapshot_fallbacks_total" in series and "incident_worker_events" not in series


@pytest.mark.parametrize(
    "expr",
    [
        "rate(incident_worker_event_total[5m])",  # a name the worker does not export
        'sum(rate(incident_worker_dead_letters_total{cause="poison"}[5m]))',  # a label it does not have
        'sum(rate(incident_worker_dead_letters_total{reason=~"poison|bad_jsn"}[5m]))',  # a reason it never gives
        "sum by (reason) (incident_worker_group_lag)",  # grouped by a label the series lacks
        "incident_worker_end_to_end_seconds",  # a histogram's family name, not a series
    ],
)
def test_the_check_catches_a_wrong_metric_or_label(expr: str) -> None:
    assert check_expr(expr, known_series())


def test_every_rule_queries_only_what_the_worker_exports() -> None:
    known = known_series()
    problems = {rule.get("alert", rule.get("record")): check_expr(rule["expr"], known) for rule in rules()}
    assert not {name: found for name, found in problems.items() if found}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_dashboard_query_is_of_what_the_worker_exports(path: Path) -> None:
    known = known_series()
    targets = dashboard_targets(path)
    assert len(targets) >= 10
    problems = {target["expr"]: check_expr(target["expr"], known) for target in targets}
    assert not {expr: found for expr, found in problems.items() if found}


def test_the_dashboard_shows_what_an_operator_looks_for() -> None:
    [path] = DASHBOARDS
    queried = {name for target in dashboard_targets(path) for name, _ in selectors(target["expr"])[0]}
    for wanted in (
        "incident_worker_events_total",  # throughput by outcome
        "incident_worker_group_lag",
        "incident_worker_group_pending",
        "incident_worker_end_to_end_seconds_bucket",  # latency quantiles
        "incident_worker_batch_seconds_bucket",
        "incident_worker_candidates_bucket",
        "incident_worker_budget_exceeded_total",  # searches cut: incomplete alerts
        "incident_worker_index_incidents",
        "incident_worker_stream_memory_bytes",
        "incident_worker_dead_letters_total",
        "incident_worker_alerts_total",  # storms
    ):
        assert wanted in queried, f"the dashboard does not show {wanted}"


def test_the_dashboard_uses_the_provisioned_data_source() -> None:
    [source] = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for target in dashboard_targets(path):
            assert target["datasource"] == {"type": source["type"], "uid": source["uid"]}
        assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"]), "panel ids must be unique"


# -- the rules and their runbooks ------------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """The runbook's `## ` sections, by anchor."""
    parts = re.split(r"^## (.+)$", RUNBOOKS.read_text(), flags=re.M)
    return {_anchor(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_alert_says_what_it_is_how_bad_and_where_its_runbook_is() -> None:
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)) and len(names) >= 15
    for rule in alerts():
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{rule['alert'].lower()}"


def test_every_alert_has_its_runbook_and_every_runbook_an_alert() -> None:
    sections = runbook_sections()
    anchors = {rule["annotations"]["runbook_url"].partition("#")[2] for rule in alerts()}
    assert anchors <= set(sections), f"no runbook section for {sorted(anchors - set(sections))}"
    for anchor in anchors:
        body = sections[anchor]
        for part in ("What it means", "How to confirm", "What to do", "When to escalate"):
            assert f"**{part}.**" in body, f"the runbook of {anchor} lacks {part!r}"
    alert_sections = {anchor for anchor in sections if anchor.startswith("incidentworker")}
    assert alert_sections <= anchors, f"runbook sections of no alert: {sorted(alert_sections - anchors)}"


def test_the_runbooks_name_real_keys_and_commands() -> None:
    text = RUNBOOKS.read_text()
    keys = Settings().keys
    for key in (keys.meta, keys.workers, keys.lease("upkeep"), "{incidents}:events", "{incidents}:dead"):
        assert key in text, f"docs/runbooks.md never names {key}"
    for command in re.findall(r"incident-worker ([a-z][a-z-]*)", text):
        assert (ROOT / "worker" / "commands" / f"{command.replace('-', '_')}.py").exists(), command


def test_the_settings_the_runbooks_name_exist() -> None:
    text = RUNBOOKS.read_text()
    named = set(re.findall(r"`INCIDENT_WORKER_([A-Z0-9_]+)(?:=[^`]*)?`", text))
    named |= set(re.findall(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:=[^`]*)?`", text))
    named |= set(re.findall(r"\(`([A-Z]+)`\)", text))  # a one-word setting in parentheses: (`RETENTION`)
    assert {"MAX_DELIVERIES", "ALERTS_MAX_MEMORY", "RETENTION"} - named == set()
    unknown = {name for name in named if name.removeprefix("INCIDENT_WORKER_").lower() not in Settings.model_fields}
    assert not unknown, f"docs/runbooks.md names settings that do not exist: {sorted(unknown)}"


def _dead_letter_alerts(reason: str) -> list[str]:
    """The dead-letter alerts whose selector takes `reason`."""
    taken = []
    for rule in alerts():
        for name, matchers in selectors(rule["expr"])[0]:
            if name != "incident_worker_dead_letters_total":
                continue
            ok = True
            for label, op, value in matchers:
                if label == "reason":
                    hit = re.fullmatch(value, reason) is not None if "~" in op else value == reason
                    ok = ok and (hit if op in {"=", "=~"} else not hit)
            if ok:
                taken.append(rule["alert"])
    return taken


def test_every_dead_letter_reason_has_one_alert_and_poison_pages() -> None:
    severity = {rule["alert"]: rule["labels"]["severity"] for rule in alerts()}
    for reason in REASONS:
        [alert] = _dead_letter_alerts(reason)
        assert severity[alert] == ("page" if reason == "poison" else "ticket"), (reason, alert)
    assert _dead_letter_alerts("bad_json") == ["IncidentWorkerProducerDeadLetters"]


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    require_promtool()
    checked = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = sorted((PROMETHEUS / "tests").glob("*.yml"))
    assert tests
    ran = subprocess.run(["promtool", "test", "rules", *map(str, tests)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    tested = {alert for path in tests for alert in re.findall(r"alertname: (\w+)", path.read_text())}
    assert {rule["alert"] for rule in alerts()} <= tested, "an alert without a unit test"


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    require_promtool()
    exprs = [t["expr"].replace("$__rate_interval", "5m") for path in DASHBOARDS for t in dashboard_targets(path)]
    recording = {
        "groups": [{"name": "dashboard", "rules": [{"record": f"q:{i}", "expr": e} for i, e in enumerate(exprs)]}]
    }
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump(recording))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- the compose profile ---------------------------------------------------------------------------------------


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """A service's bind mounts of this repository, by their path in the container."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            found[target] = ROOT / source
    return found


def test_the_monitoring_profile_scrapes_both_workers_with_the_rules_loaded() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    monitoring = {name for name, service in services.items() if "monitoring" in service.get("profiles", [])}
    assert monitoring == {"prometheus", "grafana"}
    prometheus = services["prometheus"]
    mounts = _mounts(prometheus)
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    assert [mounts[path] for path in config["rule_files"]] == [RULES]
    [job] = config["scrape_configs"]
    workers = {
        name: service
        for name, service in services.items()
        if service.get("environment", {}).get("INCIDENT_WORKER_CONSUMER") is not None
    }
    assert len(workers) == 2
    ports = {service["environment"]["INCIDENT_WORKER_METRICS_PORT"] for service in workers.values()}
    [targets] = [c["targets"] for c in job["static_configs"]]
    assert sorted(targets) == sorted(f"{name}:{port}" for name in workers for port in ports)
    assert all(f'up{{job="{job["job_name"]}"}}' in rule["expr"] for rule in alerts() if "up{" in rule["expr"])
    expected = next(rule for rule in rules() if rule.get("record") == "incident_worker:expected_workers")
    assert expected["expr"] == f"vector({len(workers)})"


def test_promtool_accepts_the_profiles_prometheus_config(tmp_path: Path) -> None:
    require_promtool()
    mounts = _mounts(yaml.safe_load(COMPOSE.read_text())["services"]["prometheus"])
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    config["rule_files"] = [str(mounts[path]) for path in config["rule_files"]]  # where compose mounts them from
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_monitoring_profile_provisions_the_dashboard_on_loopback_ports() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    grafana = services["grafana"]
    mounts = _mounts(grafana)
    assert mounts["/etc/grafana/provisioning"] == GRAFANA / "provisioning"
    [provider] = yaml.safe_load((GRAFANA / "provisioning/dashboards/incident-worker.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == GRAFANA / "dashboards"
    home = Path(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (mounts[str(home.parent)] / home.name).exists()
    for name in ("prometheus", "grafana"):
        image = services[name]["image"]
        assert re.fullmatch(r"[a-z/]+:v?\d+\.\d+\.\d+", image), f"{name}'s image tag is not pinned: {image}"
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"]), "open to the network"
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "docker compose --profile monitoring up" in readme
    assert "http://localhost:9090" in readme and "http://localhost:3000" in readme


# -- what the upkeep reports -----------------------------------------------------------------------------------


class _Log:
    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: None


@pytest.fixture
def client(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    import os

    for name in list(os.environ):
        if name.startswith("INCIDENT_WORKER_"):
            monkeypatch.delenv(name)
    real = redis_server.client()
    real.flushall()
    real.function_flush()
    library.load(real)
    yield real
    real.close()


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def _tick_until_held(jobs: list[Upkeep]) -> Upkeep:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for job in jobs:
            job.tick()
            if job.holding:
                return job
        time.sleep(0.05)
    raise AssertionError("no worker took the upkeep lease")


def test_the_upkeep_reports_its_lease_the_streams_memory_and_retention(client: redis.Redis) -> None:
    index = FingerprintIndex(client)
    for n in range(3000):
        client.xadd("{incidents}:alerts", {"incident_id": f"inc-{n}", "matches": "x" * 500})
    jobs = []
    for consumer in ("w1", "w2"):
        settings = Settings(consumer=consumer, alerts_max_memory="1mb", retention="30d")
        jobs.append(Upkeep(index, settings, _Log(), Metrics()))
    jobs[0].configure()
    jobs[1].configure()
    for job in jobs:
        assert _sample(job.metrics, "incident_worker_retention_seconds") == 30 * 86400
    holder = _tick_until_held(jobs)
    other = jobs[1 - jobs.index(holder)]
    other.tick()
    assert _sample(holder.metrics, "incident_worker_upkeep_lease_held") == 1
    assert _sample(other.metrics, "incident_worker_upkeep_lease_held") == 0
    used = _sample(holder.metrics, "incident_worker_stream_memory_bytes", stream="alerts")
    assert used is not None and used > 1024**2, "measured before trimming: over the budget"
    assert _sample(holder.metrics, "incident_worker_stream_memory_budget_bytes", stream="alerts") == 1024**2
    assert _sample(other.metrics, "incident_worker_stream_memory_bytes", stream="alerts") is None
    holder.release()
    assert _sample(holder.metrics, "incident_worker_upkeep_lease_held") == 0
    assert _sample(holder.metrics, "incident_worker_stream_memory_bytes", stream="alerts") is None, "gone stale"
    assert _tick_until_held([other]) is other
    assert _sample(other.metrics, "incident_worker_upkeep_lease_held") == 1


def test_retention_off_is_reported_as_zero_by_a_worker_without_the_setting(client: redis.Redis) -> None:
    job = Upkeep(FingerprintIndex(client), Settings(consumer="w1"), _Log(), Metrics())
    job.configure()
    assert _sample(job.metrics, "incident_worker_retention_seconds") == 0


def test_snapshot_fallbacks_are_read_where_the_read_path_counts_them() -> None:
    metrics = Metrics()
    assert _sample(metrics, "incident_worker_snapshot_fallbacks_total") == 0
    count = [0]
    metrics.follow_snapshot_fallbacks(lambda: count[0])
    count[0] = 7
    assert _sample(metrics, "incident_worker_snapshot_fallbacks_total") == 7


def test_ci_installs_promtool() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert "command -v promtool" in run and "apt-get install -y -qq --no-install-recommends prometheus" in run
