//! Maintenance windows: from the `cluster_maintenance_config` resource to the schedules agents
//! export for their updaters, and back.
//!
//! Data flow: an administrator stores `spec.agent_upgrades` ([`AgentUpgradeWindow`], parsed as
//! part of [`crate::resource::ClusterMaintenanceConfig`]); the Auth Service or agent computes
//! [`AgentUpgradeWindow::next_windows`] and writes them out as the Linux schedule file
//! ([`render_schedule_file`]) or the Kubernetes schedule JSON ([`render_kube_schedule`]); the
//! updaters parse those ([`parse_schedule_file`], [`parse_kube_schedule`]) and ask
//! [`in_window`]. Everything here is a pure function of its inputs: "now" is always passed in.
//!
//! A window starts at `utc_start_hour:00` UTC on each allowed weekday and lasts exactly one hour;
//! it is open strictly between its start and its end.

use std::{fmt, time::SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::{Date, Duration, OffsetDateTime, Time, format_description::well_known::Rfc3339};

/// The weekday type used in [`AgentUpgradeWindow`], re-exported so callers need not depend on
/// `time` themselves.
pub use time::Weekday;

/// Length of every maintenance window (specification §8).
pub const WINDOW_LENGTH: std::time::Duration = std::time::Duration::from_secs(3600);

/// First line of the Linux schedule file.
pub(crate) const SCHEDULE_FILE_HEADER: &str =
    "# periodically exported by svc, modifications are not preserved";

/// The weekday names accepted in `spec.agent_upgrades.weekdays`, in any case.
pub const WEEKDAY_NAMES: [&str; 14] = [
    "Sun",
    "Mon",
    "Tue",
    "Wed",
    "Thu",
    "Fri",
    "Sat",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

const WEEK: [Weekday; 7] = [
    Weekday::Sunday,
    Weekday::Monday,
    Weekday::Tuesday,
    Weekday::Wednesday,
    Weekday::Thursday,
    Weekday::Friday,
    Weekday::Saturday,
];

/// Why maintenance data is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MaintenanceError {
    /// `utc_start_hour` outside 0–23.
    #[error("utc_start_hour: expected an hour from 0 to 23, got {0}")]
    Hour(i64),
    /// A weekday name that is neither a short nor a long English name.
    #[error(
        "unknown weekday \"{0}\", expected one of: Sun, Mon, Tue, Wed, Thu, Fri, Sat, Sunday, Monday, Tuesday, Wednesday, Thursday, Friday, Saturday (any case)"
    )]
    Weekday(String),
}

/// Why a Linux schedule file or a Kubernetes schedule document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A line of the schedule file is not `<start_unix_seconds> <end_unix_seconds>`.
    #[error("schedule line {line}: expected \"<start_unix_seconds> <end_unix_seconds>\", got \"{text}\"")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// A window whose end is not after its start.
    #[error("schedule line {line}: window end {end} is not after its start {start}")]
    Inverted {
        /// 1-based line number (the index of the window, 1-based, for the Kubernetes JSON).
        line: usize,
        /// Start, Unix seconds.
        start: i64,
        /// End, Unix seconds.
        end: i64,
    },
    /// A timestamp outside the representable range.
    #[error("schedule line {line}: timestamp {value} is out of range")]
    OutOfRange {
        /// 1-based line number (window index for the Kubernetes JSON).
        line: usize,
        /// The timestamp as written.
        value: String,
    },
    /// The Kubernetes schedule JSON is malformed.
    #[error("kubernetes schedule: {0}")]
    Json(String),
}

/// Parses one weekday name: `Mon` or `Monday`, in any case.
///
/// The short and long names map to the same [`Weekday`] value, so later comparisons never mix
/// spellings (the original compared `Mon` against `Monday` and never opened a window).
pub(crate) fn parse_weekday(name: &str) -> Result<Weekday, MaintenanceError> {
    let lower = name.to_ascii_lowercase();
    WEEK.iter()
        .copied()
        .find(|day| {
            let long = day.to_string().to_ascii_lowercase();
            lower == long || lower == long[..3]
        })
        .ok_or_else(|| MaintenanceError::Weekday(name.to_owned()))
}

/// The short English name (`Mon`), as svc writes weekdays back out.
pub(crate) fn weekday_short_name(day: Weekday) -> &'static str {
    match day {
        Weekday::Sunday => "Sun",
        Weekday::Monday => "Mon",
        Weekday::Tuesday => "Tue",
        Weekday::Wednesday => "Wed",
        Weekday::Thursday => "Thu",
        Weekday::Friday => "Fri",
        Weekday::Saturday => "Sat",
    }
}

/// `spec.agent_upgrades` of the `cluster_maintenance_config` resource: when agents may be updated.
///
/// Built only through [`AgentUpgradeWindow::new`] or deserialization, both of which validate, so
/// the window arithmetic never sees an hour above 23.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUpgradeWindow {
    utc_start_hour: u8,
    /// Sorted Sunday-first and deduplicated; empty means every day.
    weekdays: Vec<Weekday>,
}

/// One maintenance window, `[start, end]`, open strictly inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    /// When the window starts (not yet open at this instant).
    pub start: SystemTime,
    /// When the window ends (no longer open at this instant).
    pub end: SystemTime,
}

impl Window {
    /// Whether `now` is strictly inside the window.
    pub fn contains(&self, now: SystemTime) -> bool {
        self.start < now && now < self.end
    }
}

impl AgentUpgradeWindow {
    /// Validates and builds a schedule. `weekdays` may be empty (every day) and may repeat days.
    pub fn new(
        utc_start_hour: u8,
        weekdays: impl IntoIterator<Item = Weekday>,
    ) -> Result<Self, MaintenanceError> {
        if utc_start_hour > 23 {
            return Err(MaintenanceError::Hour(i64::from(utc_start_hour)));
        }
        let mut days: Vec<Weekday> = weekdays.into_iter().collect();
        days.sort_by_key(|d| d.number_days_from_sunday());
        days.dedup();
        Ok(Self {
            utc_start_hour,
            weekdays: days,
        })
    }

    /// The UTC hour at which each window starts, 0–23.
    pub fn utc_start_hour(&self) -> u8 {
        self.utc_start_hour
    }

    /// The allowed weekdays, Sunday first; empty means every day.
    pub fn weekdays(&self) -> &[Weekday] {
        &self.weekdays
    }

    /// Whether maintenance may happen on `day`.
    pub fn allows(&self, day: Weekday) -> bool {
        self.weekdays.is_empty() || self.weekdays.contains(&day)
    }

    /// The window that starts on `date` at the start hour.
    fn window_on(&self, date: Date) -> Window {
        let start =
            date.with_time(Time::MIDNIGHT).assume_utc() + Duration::hours(i64::from(self.utc_start_hour));
        Window {
            start: start.into(),
            end: (start + Duration::HOUR).into(),
        }
    }

    /// Whether a window is open at `now` (strictly between its start and its end).
    pub fn is_open(&self, now: SystemTime) -> bool {
        // A window never crosses midnight UTC (it ends at 24:00 at the latest), so the only
        // candidate is the one that starts on today's date.
        let today = OffsetDateTime::from(now).date();
        self.allows(today.weekday()) && self.window_on(today).contains(now)
    }

    /// The next `n` windows that have not ended at `now`, in order: the open window first if
    /// there is one, then the upcoming ones.
    pub fn next_windows(&self, now: SystemTime, n: usize) -> Vec<Window> {
        let mut out = Vec::with_capacity(n);
        let mut date = OffsetDateTime::from(now).date();
        // At least one day per week is allowed, so every 7 days yield a window: this bound is
        // never the reason the loop stops unless the calendar runs out.
        let mut budget = n.saturating_mul(7).saturating_add(7);
        while out.len() < n && budget > 0 {
            budget -= 1;
            if self.allows(date.weekday()) {
                let window = self.window_on(date);
                if window.end > now {
                    out.push(window);
                }
            }
            match date.next_day() {
                Some(next) => date = next,
                None => break,
            }
        }
        out
    }
}

impl Serialize for AgentUpgradeWindow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("AgentUpgradeWindow", 2)?;
        s.serialize_field("utc_start_hour", &self.utc_start_hour)?;
        let names: Vec<&str> = self.weekdays.iter().map(|d| weekday_short_name(*d)).collect();
        s.serialize_field("weekdays", &names)?;
        s.end()
    }
}

impl<'de> Deserialize<'de> for AgentUpgradeWindow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            utc_start_hour: Hour,
            #[serde(default)]
            weekdays: Vec<WeekdayName>,
        }
        let raw = Raw::deserialize(deserializer)?;
        AgentUpgradeWindow::new(raw.utc_start_hour.0, raw.weekdays.into_iter().map(|d| d.0))
            .map_err(serde::de::Error::custom)
    }
}

/// An hour 0–23, rejected while deserializing so the error carries the field path.
struct Hour(u8);

impl<'de> Deserialize<'de> for Hour {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = i64::deserialize(deserializer)?;
        match u8::try_from(value) {
            Ok(h) if h <= 23 => Ok(Hour(h)),
            // The path (`…utc_start_hour`) is added by the caller, so the message omits the name.
            _ => Err(serde::de::Error::custom(format!(
                "expected an hour from 0 to 23, got {value}"
            ))),
        }
    }
}

/// A weekday name, rejected while deserializing so the error carries the list index.
struct WeekdayName(Weekday);

impl<'de> Deserialize<'de> for WeekdayName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        parse_weekday(&name)
            .map(WeekdayName)
            .map_err(serde::de::Error::custom)
    }
}

/// Whether `now` is strictly inside any of `windows` (as read from an exported schedule).
pub fn in_window(windows: &[Window], now: SystemTime) -> bool {
    windows.iter().any(|w| w.contains(now))
}

fn unix_seconds(t: SystemTime) -> i64 {
    OffsetDateTime::from(t).unix_timestamp()
}

fn from_unix(line: usize, text: &str, secs: i64) -> Result<SystemTime, ScheduleError> {
    OffsetDateTime::from_unix_timestamp(secs)
        .map(SystemTime::from)
        .map_err(|_| ScheduleError::OutOfRange {
            line,
            value: text.to_owned(),
        })
}

/// Renders the Linux schedule file: the header line, then `<start> <end>` in Unix seconds per
/// window, each line ending in a newline.
pub fn render_schedule_file(windows: &[Window]) -> String {
    let mut out = String::with_capacity(SCHEDULE_FILE_HEADER.len() + 1 + windows.len() * 22);
    out.push_str(SCHEDULE_FILE_HEADER);
    out.push('\n');
    for w in windows {
        out.push_str(&format!("{} {}\n", unix_seconds(w.start), unix_seconds(w.end)));
    }
    out
}

/// Parses the Linux schedule file.
///
/// An empty file (what a reset writes) is no schedule. Comment lines (`#`) and blank lines are
/// skipped; every other line must be `<start_unix_seconds> <end_unix_seconds>` with the end after
/// the start, else the error names the line.
pub fn parse_schedule_file(text: &str) -> Result<Vec<Window>, ScheduleError> {
    let mut windows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let malformed = || ScheduleError::Malformed {
            line,
            text: raw.to_owned(),
        };
        let mut fields = trimmed.split_ascii_whitespace();
        let (Some(start), Some(end), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(malformed());
        };
        let start_secs: i64 = start.parse().map_err(|_| malformed())?;
        let end_secs: i64 = end.parse().map_err(|_| malformed())?;
        if end_secs <= start_secs {
            return Err(ScheduleError::Inverted {
                line,
                start: start_secs,
                end: end_secs,
            });
        }
        windows.push(Window {
            start: from_unix(line, start, start_secs)?,
            end: from_unix(line, end, end_secs)?,
        });
    }
    Ok(windows)
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KubeSchedule {
    windows: Vec<KubeWindow>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KubeWindow {
    #[serde(with = "time::serde::rfc3339")]
    start: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    stop: OffsetDateTime,
}

/// Renders the Kubernetes schedule JSON stored under `agent-maintenance-schedule`:
/// `{"windows":[{"start":"<RFC 3339>","stop":"<RFC 3339>"}]}`, in UTC.
pub fn render_kube_schedule(windows: &[Window]) -> String {
    let doc = KubeSchedule {
        windows: windows
            .iter()
            .map(|w| KubeWindow {
                start: OffsetDateTime::from(w.start),
                stop: OffsetDateTime::from(w.end),
            })
            .collect(),
    };
    // Serializing plain structs of strings cannot fail; fall back to an empty schedule rather
    // than panic should serde_json ever disagree.
    serde_json::to_string(&doc).unwrap_or_else(|_| String::from("{\"windows\":[]}"))
}

/// Parses the Kubernetes schedule JSON. An empty (or all white space) value is no schedule.
pub fn parse_kube_schedule(text: &str) -> Result<Vec<Window>, ScheduleError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let doc: KubeSchedule = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| ScheduleError::Json(format!("{}: {}", e.path(), e.inner())))?;
    de.end().map_err(|e| ScheduleError::Json(e.to_string()))?;
    doc.windows
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            if w.stop <= w.start {
                return Err(ScheduleError::Inverted {
                    line: i + 1,
                    start: w.start.unix_timestamp(),
                    end: w.stop.unix_timestamp(),
                });
            }
            Ok(Window {
                start: w.start.into(),
                end: w.stop.into(),
            })
        })
        .collect()
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let start = OffsetDateTime::from(self.start)
            .format(&Rfc3339)
            .map_err(|_| fmt::Error)?;
        let end = OffsetDateTime::from(self.end)
            .format(&Rfc3339)
            .map_err(|_| fmt::Error)?;
        write!(f, "{start} - {end}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use time::macros::datetime;

    fn at(t: OffsetDateTime) -> SystemTime {
        t.into()
    }

    fn sched(hour: u8, days: &[&str]) -> AgentUpgradeWindow {
        AgentUpgradeWindow::new(hour, days.iter().map(|d| parse_weekday(d).unwrap())).unwrap()
    }

    #[test]
    fn weekday_names_short_long_any_case() {
        for (i, name) in WEEKDAY_NAMES.iter().enumerate() {
            assert_eq!(parse_weekday(name).unwrap(), WEEK[i % 7]);
            assert_eq!(parse_weekday(&name.to_uppercase()).unwrap(), WEEK[i % 7]);
            assert_eq!(parse_weekday(&name.to_lowercase()).unwrap(), WEEK[i % 7]);
        }
        let err = parse_weekday("Mond").unwrap_err().to_string();
        assert!(
            err.starts_with("unknown weekday \"Mond\", expected one of: Sun, Mon,"),
            "{err}"
        );
        assert!(parse_weekday("").is_err());
        assert!(parse_weekday("Tues").is_err());
    }

    #[test]
    fn hour_above_23_rejected() {
        assert_eq!(
            AgentUpgradeWindow::new(24, []).unwrap_err().to_string(),
            "utc_start_hour: expected an hour from 0 to 23, got 24"
        );
    }

    /// A known pitfall: short names in the config must open Monday windows.
    #[test]
    fn short_weekday_name_opens_monday_window() {
        let s: AgentUpgradeWindow = serde_yaml_ng::from_str("utc_start_hour: 2\nweekdays: [Mon]").unwrap();
        // 2024-01-01 is a Monday.
        assert!(s.is_open(at(datetime!(2024-01-01 02:30 UTC))));
        assert!(!s.is_open(at(datetime!(2024-01-02 02:30 UTC))));
        let w = s.next_windows(at(datetime!(2023-12-30 12:00 UTC)), 1);
        assert_eq!(w[0].start, at(datetime!(2024-01-01 02:00 UTC)));
        assert_eq!(w[0].end, at(datetime!(2024-01-01 03:00 UTC)));
        let long: AgentUpgradeWindow =
            serde_yaml_ng::from_str("utc_start_hour: 2\nweekdays: [MONDAY]").unwrap();
        assert_eq!(long, s);
    }

    #[test]
    fn boundaries_are_not_open() {
        let s = sched(2, &["Mon"]);
        assert!(!s.is_open(at(datetime!(2024-01-01 02:00 UTC))));
        assert!(s.is_open(at(datetime!(2024-01-01 02:00:00.000_000_001 UTC))));
        assert!(s.is_open(at(datetime!(2024-01-01 02:59:59 UTC))));
        assert!(!s.is_open(at(datetime!(2024-01-01 03:00 UTC))));
        assert!(!s.is_open(at(datetime!(2024-01-01 01:59:59 UTC))));
    }

    #[test]
    fn hour_23_window_ends_at_midnight() {
        let s = sched(23, &["Sat"]);
        // 2024-01-06 is a Saturday.
        assert!(s.is_open(at(datetime!(2024-01-06 23:59:59 UTC))));
        assert!(!s.is_open(at(datetime!(2024-01-07 00:00 UTC))));
        assert!(
            !s.is_open(at(datetime!(2024-01-07 00:30 UTC))),
            "Sunday is not allowed"
        );
        let w = s.next_windows(at(datetime!(2024-01-06 23:30 UTC)), 2);
        assert_eq!(w[0].start, at(datetime!(2024-01-06 23:00 UTC)));
        assert_eq!(w[0].end, at(datetime!(2024-01-07 00:00 UTC)));
        assert_eq!(w[1].start, at(datetime!(2024-01-13 23:00 UTC)));
    }

    #[test]
    fn week_wraps_from_saturday_to_sunday() {
        let s = sched(10, &["Sun", "Sat"]);
        // Saturday 2024-01-06 23:00: the Saturday window is over, next are Sun then Sat.
        let w = s.next_windows(at(datetime!(2024-01-06 23:00 UTC)), 3);
        let starts: Vec<SystemTime> = w.iter().map(|w| w.start).collect();
        assert_eq!(
            starts,
            vec![
                at(datetime!(2024-01-07 10:00 UTC)),
                at(datetime!(2024-01-13 10:00 UTC)),
                at(datetime!(2024-01-14 10:00 UTC)),
            ]
        );
    }

    #[test]
    fn empty_weekdays_means_every_day() {
        let s = sched(5, &[]);
        let w = s.next_windows(at(datetime!(2024-01-01 06:00 UTC)), 7);
        assert_eq!(w.len(), 7);
        for (i, w) in w.iter().enumerate() {
            let expected = datetime!(2024-01-02 05:00 UTC) + Duration::days(i as i64);
            assert_eq!(w.start, at(expected));
        }
        assert!(s.is_open(at(datetime!(2024-01-04 05:01 UTC))));
    }

    #[test]
    fn open_window_counts_first_and_start_instant_is_upcoming() {
        let s = sched(2, &["Mon"]);
        let open = s.next_windows(at(datetime!(2024-01-01 02:10 UTC)), 1);
        assert_eq!(open[0].start, at(datetime!(2024-01-01 02:00 UTC)));
        let at_start = s.next_windows(at(datetime!(2024-01-01 02:00 UTC)), 1);
        assert_eq!(at_start[0].start, at(datetime!(2024-01-01 02:00 UTC)));
        let at_end = s.next_windows(at(datetime!(2024-01-01 03:00 UTC)), 1);
        assert_eq!(at_end[0].start, at(datetime!(2024-01-08 02:00 UTC)));
        assert!(s.next_windows(at(datetime!(2024-01-01 03:00 UTC)), 0).is_empty());
    }

    #[test]
    fn deserialize_errors() {
        let e = serde_yaml_ng::from_str::<AgentUpgradeWindow>("utc_start_hour: 24").unwrap_err();
        assert!(
            e.to_string().contains("expected an hour from 0 to 23, got 24"),
            "{e}"
        );
        let e = serde_yaml_ng::from_str::<AgentUpgradeWindow>("utc_start_hour: -1").unwrap_err();
        assert!(e.to_string().contains("got -1"), "{e}");
        let e = serde_yaml_ng::from_str::<AgentUpgradeWindow>("utc_start_hour: 1\nweekdays: [Funday]")
            .unwrap_err();
        assert!(e.to_string().contains("unknown weekday \"Funday\""), "{e}");
        let e = serde_yaml_ng::from_str::<AgentUpgradeWindow>("utc_start_hour: 1\nhours: 2").unwrap_err();
        assert!(e.to_string().contains("unknown field `hours`"), "{e}");
        let s: AgentUpgradeWindow =
            serde_yaml_ng::from_str("utc_start_hour: 0\nweekdays: [sat, Sun, sun]").unwrap();
        assert_eq!(s.weekdays(), &[Weekday::Sunday, Weekday::Saturday]);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"utc_start_hour":0,"weekdays":["Sun","Sat"]}"#
        );
    }

    #[test]
    fn schedule_file_render_and_parse() {
        let s = sched(2, &["Mon"]);
        let w = s.next_windows(at(datetime!(2024-01-01 00:00 UTC)), 2);
        let text = render_schedule_file(&w);
        assert_eq!(
            text,
            "# periodically exported by svc, modifications are not preserved\n\
             1704074400 1704078000\n1704679200 1704682800\n"
        );
        assert_eq!(parse_schedule_file(&text).unwrap(), w);
        assert!(parse_schedule_file("").unwrap().is_empty());
        assert!(
            parse_schedule_file(&render_schedule_file(&[]))
                .unwrap()
                .is_empty()
        );
        assert!(in_window(&w, at(datetime!(2024-01-08 02:30 UTC))));
        assert!(!in_window(&w, at(datetime!(2024-01-08 03:00 UTC))));
        assert!(!in_window(&[], at(datetime!(2024-01-08 02:30 UTC))));
    }

    #[test]
    fn schedule_file_errors_name_the_line() {
        let header = SCHEDULE_FILE_HEADER;
        let cases = [
            (
                format!("{header}\n1 2\nfoo bar\n"),
                "schedule line 3: expected \"<start_unix_seconds> <end_unix_seconds>\", got \"foo bar\"",
            ),
            (
                format!("{header}\n1\n"),
                "schedule line 2: expected \"<start_unix_seconds> <end_unix_seconds>\", got \"1\"",
            ),
            (
                "1 2 3\n".to_owned(),
                "schedule line 1: expected \"<start_unix_seconds> <end_unix_seconds>\", got \"1 2 3\"",
            ),
            (
                format!("{header}\n\n5 5\n"),
                "schedule line 3: window end 5 is not after its start 5",
            ),
            (
                "1 99999999999999999\n".to_owned(),
                "schedule line 1: timestamp 99999999999999999 is out of range",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_schedule_file(&text).unwrap_err().to_string(), expected);
        }
    }

    #[test]
    fn kube_schedule_render_and_parse() {
        let s = sched(23, &["Sat"]);
        let w = s.next_windows(at(datetime!(2024-01-06 00:00 UTC)), 1);
        let json = render_kube_schedule(&w);
        assert_eq!(
            json,
            r#"{"windows":[{"start":"2024-01-06T23:00:00Z","stop":"2024-01-07T00:00:00Z"}]}"#
        );
        assert_eq!(parse_kube_schedule(&json).unwrap(), w);
        assert!(parse_kube_schedule("").unwrap().is_empty());
        assert_eq!(render_kube_schedule(&[]), r#"{"windows":[]}"#);
        // Offsets other than Z are read correctly.
        let other =
            r#"{"windows":[{"start":"2024-01-07T01:00:00+02:00","stop":"2024-01-07T02:00:00+02:00"}]}"#;
        assert_eq!(parse_kube_schedule(other).unwrap(), w);
        let err = parse_kube_schedule(r#"{"windows":[{"start":"yesterday","stop":"2024-01-07T00:00:00Z"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("kubernetes schedule: windows[0].start: "),
            "{err}"
        );
        let err = parse_kube_schedule(
            r#"{"windows":[{"start":"2024-01-07T00:00:00Z","stop":"2024-01-07T00:00:00Z"}]}"#,
        )
        .unwrap_err();
        assert!(matches!(err, ScheduleError::Inverted { line: 1, .. }));
        assert!(parse_kube_schedule(r#"{"windows":[],"extra":1}"#).is_err());
    }

    fn arb_schedule() -> impl Strategy<Value = AgentUpgradeWindow> {
        (0u8..24, proptest::collection::vec(0usize..7, 0..8))
            .prop_map(|(h, days)| AgentUpgradeWindow::new(h, days.into_iter().map(|d| WEEK[d])).unwrap())
    }

    proptest! {
        #[test]
        fn windows_are_well_formed(s in arb_schedule(), now in 0i64..4_102_444_800, n in 0usize..20) {
            let now = SystemTime::from(OffsetDateTime::from_unix_timestamp(now).unwrap());
            let windows = s.next_windows(now, n);
            prop_assert_eq!(windows.len(), n);
            for (i, w) in windows.iter().enumerate() {
                prop_assert_eq!(w.end.duration_since(w.start).unwrap(), WINDOW_LENGTH);
                let start = OffsetDateTime::from(w.start);
                prop_assert_eq!(start.hour(), s.utc_start_hour());
                prop_assert_eq!((start.minute(), start.second(), start.nanosecond()), (0, 0, 0));
                prop_assert!(s.allows(start.weekday()));
                prop_assert!(w.end > now);
                if i > 0 {
                    prop_assert!(windows[i - 1].end <= w.start, "sorted and non-overlapping");
                }
            }
            // is_open agrees with the first window.
            let first = s.next_windows(now, 1);
            prop_assert_eq!(s.is_open(now), first[0].contains(now));
        }

        #[test]
        fn schedule_formats_round_trip(s in arb_schedule(), now in 0i64..4_102_444_800, n in 0usize..10) {
            let now = SystemTime::from(OffsetDateTime::from_unix_timestamp(now).unwrap());
            let windows = s.next_windows(now, n);
            prop_assert_eq!(&parse_schedule_file(&render_schedule_file(&windows)).unwrap(), &windows);
            prop_assert_eq!(&parse_kube_schedule(&render_kube_schedule(&windows)).unwrap(), &windows);
        }

        #[test]
        fn schedule_parser_never_panics(text in "[0-9 #a\\n-]{0,64}") {
            let _ = parse_schedule_file(&text);
        }
    }
}
