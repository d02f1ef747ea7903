"""What time, storage and video-seconds cost: the rates a cost record is written at, each with its source.

Money is integer micro-dollars in the database (exact sums, no float drift); a rate keeps its source so an old report
keeps its numbers when the settings change.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.db.rows import CostRecord


@dataclass(frozen=True)
class Rate:
    """A worker's price per hour of up time (a GPU-hour), with where it comes from."""

    usd_per_hour: float
    source: str

    def micro_usd(self, seconds: float) -> int:
        return round(seconds * self.usd_per_hour / 3600 * 1e6)


def charge(video_id: int, kind: str, seconds: float, rate: Rate, session_id: int | None,
           precision: str | None = None) -> CostRecord:
    """One cost record: `seconds` of worker time spent on a video, at `rate`, by the worker session `session_id`;
    a render's, with the `precision` it rendered at."""
    return CostRecord(video_id=video_id, kind=kind, seconds=seconds, rate_usd_per_hour=rate.usd_per_hour,
                      rate_source=rate.source, amount_micro_usd=rate.micro_usd(seconds), session_id=session_id,
                      precision=precision)


@dataclass(frozen=True)
class StoragePrice:
    """Keeping a stored video (per GB-month, for a number of months) and serving it once (per GB; 0: not charged)."""

    gb_month_usd: float
    months: float
    egress_gb_usd: float
    source: str

    def micro_usd(self, size: float) -> tuple[int, int]:
        """Keeping `size` bytes, and serving them once (0 when egress is not charged), in micro-dollars."""
        gb = size / 1e9
        return round(gb * self.gb_month_usd * self.months * 1e6), round(gb * self.egress_gb_usd * 1e6)

    def records(self, video_id: int, size: int) -> list[CostRecord]:
        storage, egress = self.micro_usd(size)
        out = [CostRecord(video_id=video_id, kind="storage", seconds=0.0, rate_usd_per_hour=0.0,
                          rate_source=f"${self.gb_month_usd:g}/GB-month x {self.months:g} months ({self.source})",
                          amount_micro_usd=storage)]
        if self.egress_gb_usd > 0:
            out.append(CostRecord(video_id=video_id, kind="egress", seconds=0.0, rate_usd_per_hour=0.0,
                                  rate_source=f"${self.egress_gb_usd:g}/GB served once ({self.source})",
                                  amount_micro_usd=egress))
        return out


@dataclass(frozen=True)
class Price:
    """What a video-second sells for, to compute gross margin against (a setting, with its source)."""

    usd_per_video_s: float
    source: str
