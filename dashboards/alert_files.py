"""The committed alert files and their generators: write them, or check they are current.

``convowatch dashboards build`` rewrites them from the production
`AlertWindows` (with the dashboards); ``convowatch dashboards check`` lists
every file that differs from its generator.
"""

from __future__ import annotations

from pathlib import Path

from dashboards.alert_rules import rules_yaml
from dashboards.alert_windows import AlertWindows
from dashboards.grafana_alerts import grafana_alerts_json, grafana_alerts_yaml

RULES = "dashboards/alerts/convowatch.rules.yml"
GRAFANA_JSON = "dashboards/alerts/grafana/convowatch-alerts.json"
GRAFANA_PROVISIONING = "deploy/grafana/provisioning/alerting/convowatch.yml"
REPO_ROOT = Path(__file__).resolve().parent.parent


def generated(windows: AlertWindows = AlertWindows()) -> dict[str, str]:
    """Repository-relative path -> the text its generator produces for ``windows``."""
    return {
        RULES: rules_yaml(windows),
        GRAFANA_JSON: grafana_alerts_json(windows),
        GRAFANA_PROVISIONING: grafana_alerts_yaml(windows),
    }


def write(root: Path = REPO_ROOT) -> list[Path]:
    """Write every alert file under ``root``; returns the paths written."""
    written = []
    for rel, text in generated().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check(root: Path = REPO_ROOT) -> list[str]:
    """One message per alert file under ``root`` that is missing or differs from its generator (empty: all current)."""
    problems = []
    for rel, text in generated().items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing (run `convowatch dashboards build`)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{rel}: differs from its generator (run `convowatch dashboards build`)")
    return problems
