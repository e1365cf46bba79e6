"""The reports storm's reports are what an agent sends for the pod that selected: each
one validates and is in the pod's own situation (else the bench would measure reports
stored as not counted)."""

from __future__ import annotations

from mla_switchboard.core.evidence import observations_of_report, situation_of
from mla_switchboard.core.schemas import MeasurementReport, SelectRequest

from bench.boot_storm import fleet
from bench.reports_storm import report_of


def test_each_report_is_in_its_pods_situation() -> None:
    pods = [p for p in fleet(200) if p["device"]["capability"] and p["packages"]]
    assert pods
    for i, pod in enumerate(pods):
        report = MeasurementReport.model_validate(report_of(pod, i))
        (observation,) = observations_of_report(report, None, "r")
        assert observation.situation == situation_of(SelectRequest.model_validate(pod))
