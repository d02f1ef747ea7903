"""Rates and prices turned into cost records, on numbers worked out by hand."""

from datetime import datetime, timedelta, timezone

import pytest

from jobs.cost.prices import Rate, StoragePrice, charge
from jobs.reports.stats import per_hour, percentiles, span_s


def test_a_rate_charges_seconds_in_micro_dollars():
    rate = Rate(3.6, "a test rate")
    assert rate.micro_usd(10.0) == 10_000  # 10 s at $3.60 an hour is $0.01
    assert rate.micro_usd(0.25) == 250
    record = charge(7, "gpu", 10.0, rate, session_id=3)
    assert (record.video_id, record.kind, record.seconds, record.amount_micro_usd, record.session_id) == \
        (7, "gpu", 10.0, 10_000, 3)
    assert (record.rate_usd_per_hour, record.rate_source) == (3.6, "a test rate")


def test_storage_and_egress_are_charged_on_the_bytes():
    price = StoragePrice(gb_month_usd=0.023, months=2.0, egress_gb_usd=0.09, source="list")
    storage, egress = price.records(5, 500_000_000)  # half a GB
    assert (storage.kind, storage.amount_micro_usd) == ("storage", 23_000)  # 0.5 GB x $0.023 x 2 months = $0.023
    assert (egress.kind, egress.amount_micro_usd) == ("egress", 45_000)  # 0.5 GB x $0.09 = $0.045
    assert [r.kind for r in StoragePrice(0.023, 1.0, 0.0, "list").records(5, 10)] == ["storage"], "no egress at 0"


def test_report_figures():
    q = percentiles([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    # Linear between ranks: rank 9 x 0.95 = 8.55 lies between 9 and 10, so 9.55; 9 x 0.99 = 8.91 -> 9.91.
    assert q == pytest.approx({"p50": 5.5, "p95": 9.55, "p99": 9.91, "max": 10.0})
    assert percentiles([]) is None
    assert per_hour(16, 8.0) == 7200.0 and per_hour(3, 0.0) is None
    start = datetime(2026, 12, 1, 2, 0, 0, tzinfo=timezone.utc)
    starts, ends = [start, start + timedelta(seconds=5)], [start + timedelta(seconds=3), start + timedelta(seconds=12)]
    assert span_s(starts, ends) == 12.0 and span_s([], ends) == 0.0  # first start to last end
