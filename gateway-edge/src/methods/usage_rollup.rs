//! Token usage summed from transcripts, in the shapes of OpenClaw's usage
//! report: per session (`SessionUsage`) and over sessions (`Rollup`). The
//! figures are the counts runtimes reported with each assistant entry
//! (`usage_json`: `input_tokens`, `output_tokens`, `total_tokens`). No
//! prices are known here, so every cost is 0 and each priced entry counts
//! in `missingCostEntries`; there is no prompt cache, so its counts are 0.
//! Days are calendar days at a fixed UTC offset.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use session_store_api::model::TranscriptEntry;

/// The creator key of sessions whose creator is not known (all of them
/// here: sessions record none), as OpenClaw spells it.
pub(super) const UNKNOWN_CREATOR: &str = "[\"unknown\"]";
/// The one agent this gateway runs.
const AGENT_ID: &str = "main";
/// Stop reasons that make an assistant entry an error.
const ERROR_STOPS: &[&str] = &["error", "aborted", "timeout"];

/// Token counts and what they cost (always 0 here).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Totals {
    pub input: u64,
    pub output: u64,
    pub total: u64,
    /// Entries with usage but no known price.
    pub unpriced: u64,
}

impl Totals {
    pub(super) fn add(&mut self, other: Totals) {
        self.input += other.input;
        self.output += other.output;
        self.total += other.total;
        self.unpriced += other.unpriced;
    }

    /// The fields of OpenClaw's usage totals.
    pub(super) fn json(&self) -> Value {
        json!({
            "input": self.input, "output": self.output, "cacheRead": 0, "cacheWrite": 0,
            "totalTokens": self.total, "totalCost": 0, "inputCost": 0, "outputCost": 0,
            "cacheReadCost": 0, "cacheWriteCost": 0, "missingCostEntries": self.unpriced,
        })
    }

    /// One entry's usage, if it reports any.
    pub(super) fn of_entry(entry: &TranscriptEntry) -> Option<Totals> {
        let usage: Value = serde_json::from_str(entry.metadata.usage_json.as_deref()?).ok()?;
        let count = |key: &str| usage[key].as_u64().unwrap_or(0);
        let (input, output) = (count("input_tokens"), count("output_tokens"));
        let total = usage["total_tokens"]
            .as_u64()
            .filter(|&t| t > 0)
            .unwrap_or(input + output);
        Some(Totals {
            input,
            output,
            total,
            unpriced: 1,
        })
    }
}

/// Messages by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub user: u64,
    pub assistant: u64,
    pub tool_calls: u64,
    pub tool_results: u64,
    pub errors: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.user += other.user;
        self.assistant += other.assistant;
        self.tool_calls += other.tool_calls;
        self.tool_results += other.tool_results;
        self.errors += other.errors;
    }

    fn total(&self) -> u64 {
        self.user + self.assistant + self.tool_results
    }

    fn json(&self) -> Value {
        json!({
            "total": self.total(), "user": self.user, "assistant": self.assistant,
            "toolCalls": self.tool_calls, "toolResults": self.tool_results, "errors": self.errors,
        })
    }

    fn of_entry(entry: &TranscriptEntry) -> Counts {
        let mut counts = Counts::default();
        match entry.role.as_str() {
            "user" => counts.user = 1,
            "assistant" => {
                counts.assistant = 1;
                let content: Value = serde_json::from_str(&entry.content_json).unwrap_or_default();
                counts.tool_calls = content.as_array().map_or(0, |parts| {
                    parts.iter().filter(|p| p["type"] == "toolCall").count()
                }) as u64;
                let stop = entry.metadata.stop_reason.as_deref().unwrap_or_default();
                counts.errors = u64::from(ERROR_STOPS.contains(&stop));
            }
            "toolResult" | "tool" => counts.tool_results = 1,
            _ => {}
        }
        counts
    }
}

/// The model usage is attributed to: the runtime's, or the session's own
/// choice (entries do not record the model that answered them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ModelId {
    pub provider: String,
    pub model: String,
}

/// Calendar days at a fixed offset from UTC.
#[derive(Debug, Clone, Copy)]
pub(super) struct Calendar {
    pub offset_ms: i64,
}

const DAY_MS: i64 = 86_400_000;

impl Calendar {
    /// `YYYY-MM-DD` of the instant `ms`.
    pub(super) fn date(&self, ms: i64) -> String {
        let (y, m, d) = civil_from_days((ms + self.offset_ms).div_euclid(DAY_MS));
        format!("{y:04}-{m:02}-{d:02}")
    }

    /// The first instant of the day `date` (`YYYY-MM-DD`), if it is one.
    pub(super) fn start_of(&self, date: &str) -> Option<i64> {
        let mut parts = date.splitn(3, '-').map(str::parse::<i64>);
        let (y, m, d) = (
            parts.next()?.ok()?,
            parts.next()?.ok()?,
            parts.next()?.ok()?,
        );
        if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
            return None;
        }
        let days = days_from_civil(y, m, d);
        // 31 February is not a day: it would round-trip to another date.
        (civil_from_days(days) == (y, m, d)).then_some(days * DAY_MS - self.offset_ms)
    }

    pub(super) fn today_start(&self, now_ms: i64) -> i64 {
        (now_ms + self.offset_ms).div_euclid(DAY_MS) * DAY_MS - self.offset_ms
    }
}

/// The instant `ms` as ISO 8601 in UTC, to the millisecond
/// (`2026-12-05T15:04:05.123Z`).
pub(super) fn iso_utc(ms: i64) -> String {
    let time = ms.rem_euclid(DAY_MS);
    let (h, m, s, milli) = (
        time / 3_600_000,
        time / 60_000 % 60,
        time / 1000 % 60,
        time % 1000,
    );
    let date = Calendar { offset_ms: 0 }.date(ms);
    format!("{date}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// One day of a session, or of all of them.
#[derive(Debug, Clone, Copy, Default)]
struct Day {
    totals: Totals,
    counts: Counts,
    /// Entries with usage.
    priced: u64,
}

/// One session's usage over the range read.
#[derive(Debug, Default)]
pub(super) struct SessionUsage {
    pub totals: Totals,
    counts: Counts,
    first: Option<i64>,
    last: Option<i64>,
    days: BTreeMap<String, Day>,
    /// Entries with usage (the model's call count).
    priced: u64,
}

impl SessionUsage {
    /// Counts `entry`, on its day of `calendar`.
    pub(super) fn add(&mut self, entry: &TranscriptEntry, calendar: Calendar) {
        let at = entry.timestamp_ms;
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
        let counts = Counts::of_entry(entry);
        self.counts.add(counts);
        let day = self.days.entry(calendar.date(at)).or_default();
        day.counts.add(counts);
        if let Some(totals) = Totals::of_entry(entry) {
            self.totals.add(totals);
            self.priced += 1;
            day.totals.add(totals);
            day.priced += 1;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// OpenClaw's session usage summary.
    pub(super) fn json(&self, session_id: &str, model: &ModelId) -> Value {
        let mut summary = self.totals.json();
        let days = || self.days.iter();
        let extra = json!({
            "sessionId": session_id,
            "firstActivity": self.first, "lastActivity": self.last,
            "durationMs": self.last.zip(self.first).map_or(0, |(l, f)| l - f),
            "activityDates": days().map(|(date, _)| date).collect::<Vec<_>>(),
            "dailyBreakdown": days().map(|(date, day)| day_cost(date, day)).collect::<Vec<_>>(),
            "dailyMessageCounts": days().map(|(date, day)| {
                let mut counts = day.counts.json();
                counts["date"] = json!(date);
                counts
            }).collect::<Vec<_>>(),
            "dailyModelUsage": days().filter(|(_, day)| day.priced > 0).map(|(date, day)| json!({
                "date": date, "provider": model.provider, "model": model.model,
                "tokens": day.totals.total, "cost": 0, "count": day.priced,
            })).collect::<Vec<_>>(),
            "messageCounts": self.counts.json(),
            "toolUsage": { "totalCalls": self.counts.tool_calls, "uniqueTools": 0, "tools": [] },
            "modelUsage": if self.priced > 0 {
                json!([{ "provider": model.provider, "model": model.model, "count": self.priced,
                         "totals": self.totals.json() }])
            } else {
                json!([])
            },
        });
        merge(&mut summary, extra);
        summary
    }
}

/// A day's tokens and cost with its totals.
fn day_cost(date: &str, day: &Day) -> Value {
    let mut value = day.totals.json();
    merge(
        &mut value,
        json!({ "date": date, "tokens": day.totals.total, "cost": 0 }),
    );
    value
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// The usage of many sessions, summed: the report's `totals` and
/// `aggregates`.
#[derive(Debug, Default)]
pub(super) struct Rollup {
    pub totals: Totals,
    counts: Counts,
    sessions: u64,
    longest_ms: i64,
    days: BTreeMap<String, Day>,
    models: BTreeMap<ModelId, (u64, Totals)>,
    model_days: BTreeMap<(String, ModelId), (u64, Totals)>,
}

impl Rollup {
    pub(super) fn add(&mut self, usage: &SessionUsage, model: &ModelId) {
        self.totals.add(usage.totals);
        self.counts.add(usage.counts);
        if !usage.is_empty() {
            self.sessions += 1;
        }
        self.longest_ms = self
            .longest_ms
            .max(usage.last.zip(usage.first).map_or(0, |(l, f)| l - f));
        for (date, day) in &usage.days {
            let sum = self.days.entry(date.clone()).or_default();
            sum.totals.add(day.totals);
            sum.counts.add(day.counts);
            sum.priced += day.priced;
            if day.priced > 0 {
                let by_model = self
                    .model_days
                    .entry((date.clone(), model.clone()))
                    .or_default();
                by_model.0 += day.priced;
                by_model.1.add(day.totals);
            }
        }
        if usage.priced > 0 {
            let by_model = self.models.entry(model.clone()).or_default();
            by_model.0 += usage.priced;
            by_model.1.add(usage.totals);
        }
    }

    /// OpenClaw's `aggregates`.
    pub(super) fn aggregates(&self) -> Value {
        let group = |totals: &Totals| totals.json();
        let providers: BTreeMap<&str, (u64, Totals)> =
            self.models
                .iter()
                .fold(BTreeMap::new(), |mut acc, (id, (count, totals))| {
                    let sum = acc.entry(id.provider.as_str()).or_default();
                    sum.0 += count;
                    sum.1.add(*totals);
                    acc
                });
        let days = || self.days.iter();
        let by_creator_daily: Vec<Value> = days().map(|(date, day)| day_cost(date, day)).collect();
        let dates: Vec<&String> = self.days.keys().collect();
        let mut aggregates = json!({
            "sessionCount": self.sessions,
            "messages": self.counts.json(),
            "tools": { "totalCalls": self.counts.tool_calls, "uniqueTools": 0, "tools": [] },
            "byModel": by_tokens(self.models.iter().map(|(id, (count, totals))| (json!({
                "provider": id.provider, "model": id.model, "count": count,
            }), totals))),
            "byProvider": by_tokens(providers.iter().map(|(provider, (count, totals))| (json!({
                "provider": provider, "count": count,
            }), totals))),
            "byAgent": if self.sessions > 0 {
                json!([{ "agentId": AGENT_ID, "totals": group(&self.totals) }])
            } else {
                json!([])
            },
            "byChannel": [],
            "byCreator": if self.sessions > 0 {
                json!([{
                    "key": UNKNOWN_CREATOR, "totals": group(&self.totals),
                    "sessionCount": self.sessions, "daily": by_creator_daily,
                    "sessionActivity": [{ "dates": dates, "sessionCount": self.sessions }],
                }])
            } else {
                json!([])
            },
            "costDaily": days().map(|(date, day)| {
                let mut value = day.totals.json();
                value["date"] = json!(date);
                value
            }).collect::<Vec<_>>(),
            "dailyLatency": [],
            "modelDaily": self.model_days.iter().map(|((date, id), (count, totals))| json!({
                "date": date, "provider": id.provider, "model": id.model,
                "tokens": totals.total, "cost": 0, "count": count,
            })).collect::<Vec<_>>(),
            "daily": days().map(|(date, day)| json!({
                "date": date, "tokens": day.totals.total, "cost": 0,
                "messages": day.counts.total(), "toolCalls": day.counts.tool_calls,
                "errors": day.counts.errors,
            })).collect::<Vec<_>>(),
        });
        if self.longest_ms > 0 {
            aggregates["longestSessionDurationMs"] = json!(self.longest_ms);
        }
        aggregates
    }
}

/// Groups with their totals, most tokens first (costs are all 0).
fn by_tokens<'a>(groups: impl Iterator<Item = (Value, &'a Totals)>) -> Vec<Value> {
    let mut rows: Vec<(u64, Value)> = groups
        .map(|(mut row, totals)| {
            row["totals"] = totals.json();
            (totals.total, row)
        })
        .collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.0));
    rows.into_iter().map(|(_, row)| row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_at_an_offset_round_trip_and_refuse_what_is_no_date() {
        let utc = Calendar { offset_ms: 0 };
        assert_eq!(utc.date(0), "1970-01-01");
        assert_eq!(utc.date(951_782_400_000), "2000-02-29");
        assert_eq!(utc.start_of("2000-02-29"), Some(951_782_400_000));
        assert_eq!(utc.date(-1), "1969-12-31");
        assert_eq!(utc.start_of("2026-02-30"), None);
        assert_eq!(utc.start_of("2026-13-01"), None);
        assert_eq!(utc.start_of("x-01-01"), None);
        // Five and a half hours east: the day starts before UTC's.
        let india = Calendar {
            offset_ms: 330 * 60_000,
        };
        let start = india.start_of("2026-12-05").unwrap();
        assert_eq!(start, utc.start_of("2026-12-05").unwrap() - 330 * 60_000);
        assert_eq!(india.date(start), "2026-12-05");
        assert_eq!(india.date(start - 1), "2026-12-04");
        assert_eq!(india.today_start(start + 5), start);
        assert_eq!(
            iso_utc(951_782_400_000 + 3_723_004),
            "2000-02-29T01:02:03.004Z"
        );
    }
}
