"""A CronJob's schedule: the five-field cron of Kubernetes (robfig/cron's standard parser).

`minute hour day-of-month month day-of-week`, each `*` (or `?`), a number, a range `a-b`, a
step `*/n`, `a/n` or `a-b/n`, or a list of those; months and days of the week may be named
(`JAN`, `MON`); day of week 0-6 from Sunday (7 is Sunday too). The descriptors `@yearly`
(`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`) and `@hourly` stand for their
schedules. As in cron, when both day fields are restricted a day matches either; when one is
`*` only the other counts. Pure: no clock; times are computed in the schedule's time zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# How far ahead a schedule is searched: a schedule that never fires in that span ("0 0 30 2 *",
# February 30th) has no next time.
SEARCH_YEARS = 5


class CronError(ValueError):
    """A schedule that cannot be parsed; the message says what is wrong."""


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]  # of the month, 1-31
    months: frozenset[int]  # 1-12
    weekdays: frozenset[int]  # 0-6, Sunday 0
    days_star: bool  # day-of-month was `*` or `?`
    weekdays_star: bool

    def day_matches(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return in_month and in_week
        return in_month or in_week

    def next_after(self, after: datetime, zone: ZoneInfo | None = None) -> datetime | None:
        """The first time strictly after `after` (aware) the schedule fires, in UTC; None when
        it does not fire within SEARCH_YEARS."""
        tz = zone or UTC
        local = after.astimezone(tz).replace(second=0, microsecond=0, tzinfo=None)
        start = local + timedelta(minutes=1)
        day = start.replace(hour=0, minute=0)
        end = day + timedelta(days=366 * SEARCH_YEARS)
        while day < end:
            if day.month not in self.months:
                # the first of the next month
                day = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
                continue
            if self.day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        at = day.replace(hour=hour, minute=minute)
                        if at < start:
                            continue
                        fired = at.replace(tzinfo=tz).astimezone(UTC)
                        if fired > after:
                            return fired
            day += timedelta(days=1)
        return None

    def last_between(
        self, earliest: datetime, now: datetime, zone: ZoneInfo | None = None, *, cap: int = 100
    ) -> tuple[datetime | None, int]:
        """The most recent time in (earliest, now] the schedule fired, and how many times it
        fired in that span (counted up to `cap` + 1: more than `cap` is "too many")."""
        last, count, at = None, 0, earliest
        while True:
            nxt = self.next_after(at, zone)
            if nxt is None or nxt > now:
                return last, count
            last, count, at = nxt, count + 1, nxt
            if count > cap:
                # too many missed: jump to the last one before now without counting further
                back = self.last_before(now, zone, since=at)
                return (back or last), count

    def last_before(
        self, now: datetime, zone: ZoneInfo | None, *, since: datetime
    ) -> datetime | None:
        """The most recent fire time in (since, now], searched backwards a day at a time."""
        tz = zone or UTC
        local_now = now.astimezone(tz).replace(tzinfo=None)
        day = local_now.replace(hour=0, minute=0, second=0, microsecond=0)
        floor = since.astimezone(tz).replace(tzinfo=None)
        while day + timedelta(days=1) > floor:
            if day.month in self.months and self.day_matches(day):
                for hour in sorted(self.hours, reverse=True):
                    for minute in sorted(self.minutes, reverse=True):
                        at = day.replace(hour=hour, minute=minute)
                        fired = at.replace(tzinfo=tz).astimezone(UTC)
                        if since < fired <= now:
                            return fired
            day -= timedelta(days=1)
        return None


def _number(text: str, low: int, high: int, names: tuple[str, ...], offset: int) -> int:
    upper = text.upper()
    if names and upper in names:
        return names.index(upper) + offset
    if not text.isdigit():
        raise CronError(f"failed to parse int from {text}")
    value = int(text)
    if value < low:
        raise CronError(f"beginning of range ({value}) below minimum ({low}): {text}")
    if value > high:
        raise CronError(f"end of range ({value}) above maximum ({high}): {text}")
    return value


def _field(
    text: str, low: int, high: int, names: tuple[str, ...] = (), offset: int = 0
) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"empty item in list: {text}")
        body, _, step_text = part.partition("/")
        step = 1
        if _:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"step must be a positive number: {part}")
            step = int(step_text)
        if body in ("*", "?"):
            start, end = low, high
        else:
            first, dash, second = body.partition("-")
            start = _number(first, low, high, names, offset)
            end = _number(second, low, high, names, offset) if dash else (high if _ else start)
            if start > end:
                raise CronError(f"beginning of range ({start}) beyond end of range ({end}): {part}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def parse(schedule: str) -> Schedule:
    """The schedule of `schedule`, or CronError saying why it is not one."""
    text = " ".join(schedule.split())
    if text.upper().startswith(("TZ=", "CRON_TZ=")):
        raise CronError("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")
    if text.startswith("@"):
        if text not in DESCRIPTORS:
            raise CronError(f"unrecognized descriptor: {text}")
        text = DESCRIPTORS[text]
    fields = text.split(" ")
    if len(fields) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(fields)}: {schedule}")
    minute, hour, dom, month, dow = fields
    weekdays = _field(dow, 0, 7, DAYS, 0)
    if 7 in weekdays:
        weekdays = (weekdays - {7}) | {0}
    return Schedule(
        minutes=_field(minute, 0, 59),
        hours=_field(hour, 0, 23),
        days=_field(dom, 1, 31),
        months=_field(month, 1, 12, MONTHS, 1),
        weekdays=frozenset(weekdays),
        days_star=dom in ("*", "?"),
        weekdays_star=dow in ("*", "?"),
    )


def zone(name: str | None) -> ZoneInfo | None:
    """The time zone of a CronJob's `timeZone` (None: UTC, Tessera's local time), or CronError."""
    if not name:
        return None
    if name.strip() != name or name.startswith(("/", ".")) or ".." in name:
        raise CronError(f"unknown time zone {name}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise CronError(f"unknown time zone {name}") from exc
