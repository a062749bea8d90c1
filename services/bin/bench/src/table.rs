//! The report: one Markdown table, each figure beside its floor and the
//! ratio of the two.

use std::time::Duration;

use crate::plan::Scenario;
use crate::stats::Stats;

/// What `idle` measured: the edge's memory before and after holding
/// `opened` idle connections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory {
    pub opened: usize,
    pub before_kib: u64,
    pub after_kib: u64,
}

impl Memory {
    pub fn per_connection_kib(&self) -> f64 {
        self.after_kib.saturating_sub(self.before_kib) as f64 / self.opened.max(1) as f64
    }
}

/// What a scenario measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Latency(Stats),
    /// `idle`.
    Memory(Memory),
    /// It could not be measured: why.
    Failed(String),
    /// Cut off by its deadline: the samples taken until then, and how far
    /// it got.
    Incomplete(Stats, String),
}

/// One row of the report.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: Scenario,
    pub topology: String,
    pub backend: String,
    pub connections: Option<usize>,
    pub outcome: Outcome,
    pub note: String,
}

impl Row {
    /// Not measured, or not all of it.
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Failed(_) | Outcome::Incomplete(..))
    }

    /// Why it is not (all) measured, if it is not.
    pub fn error(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Failed(why) | Outcome::Incomplete(_, why) => Some(why),
            _ => None,
        }
    }

    fn latency(&self) -> Option<&Stats> {
        match &self.outcome {
            Outcome::Latency(stats) => Some(stats),
            _ => None,
        }
    }
}

/// The longest error shown in a cell (the whole one goes to stderr).
const CELL_ERROR_CHARS: usize = 240;

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn ratio(figure: Duration, floor: Duration) -> String {
    if floor.is_zero() {
        return "—".into();
    }
    format!("{:.1}", figure.as_secs_f64() / floor.as_secs_f64())
}

/// A cell's text: one line, no column separators.
pub(crate) fn cell(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut line: String = line.replace('|', "\\|");
    if line.chars().count() > CELL_ERROR_CHARS {
        line = line.chars().take(CELL_ERROR_CHARS).collect::<String>() + "…";
    }
    line
}

/// The floor row `row` is read against, if it was measured.
fn floor_of<'a>(row: &Row, floors: &'a [Row]) -> Option<(&'static str, &'a Stats)> {
    let kind = row.scenario.floor()?;
    floors
        .iter()
        .filter(|f| f.topology == kind.topology() && f.scenario == row.scenario)
        .filter(|f| f.connections == row.connections)
        .find_map(Row::latency)
        .map(|stats| (kind.mark(), stats))
}

/// The table's first two lines.
pub const HEADER: &str = "| scenario | topology | backend | connections | count | p50 ms | p99 ms | max ms | per second | floor | floor p50 ms | floor p99 ms | ratio p50 | ratio p99 | note |\n\
     |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

/// `rows`, each with its floor from `floors`, then the floors themselves.
pub fn table(rows: &[Row], floors: &[Row]) -> String {
    let mut out = String::from(HEADER);
    for row in rows {
        out.push_str(&line(row, floors));
    }
    for floor in floors {
        out.push_str(&line(floor, &[]));
    }
    out
}

/// One row of the table, beside its floor from `floors` if that was
/// measured (a floor's own row: `floors` empty).
pub fn line(row: &Row, floors: &[Row]) -> String {
    let dash = "—".to_owned();
    let connections = row.connections.map_or(dash.clone(), |c| c.to_string());
    let figures = |stats: &Stats| {
        let rate = match row.scenario {
            Scenario::Startup => dash.clone(),
            _ => format!("{:.0}", stats.rate),
        };
        [ms(stats.p50), ms(stats.p99), ms(stats.max), rate]
    };
    let none = || [dash.clone(), dash.clone(), dash.clone(), dash.clone()];
    let (count, figures, note) = match &row.outcome {
        Outcome::Latency(stats) => (stats.count.to_string(), figures(stats), cell(&row.note)),
        Outcome::Memory(memory) => (memory.opened.to_string(), none(), cell(&row.note)),
        Outcome::Failed(error) => (dash.clone(), none(), cell(&format!("error: {error}"))),
        Outcome::Incomplete(stats, why) => {
            let figures = if stats.count > 0 {
                figures(stats)
            } else {
                none()
            };
            let note = cell(&format!("incomplete: {why}"));
            (stats.count.to_string(), figures, note)
        }
    };
    let stats = match &row.outcome {
        Outcome::Latency(stats) | Outcome::Incomplete(stats, _) if stats.count > 0 => Some(stats),
        _ => None,
    };
    let floor_cells = match (floor_of(row, floors), stats) {
        (Some((mark, floor)), Some(stats)) => [
            mark.to_owned(),
            ms(floor.p50),
            ms(floor.p99),
            ratio(stats.p50, floor.p50),
            ratio(stats.p99, floor.p99),
        ],
        (Some((mark, floor)), None) => [
            mark.to_owned(),
            ms(floor.p50),
            ms(floor.p99),
            dash.clone(),
            dash.clone(),
        ],
        _ => std::array::from_fn(|_| dash.clone()),
    };
    format!(
        "| {} | {} | {} | {connections} | {count} | {} | {} |\n",
        row.scenario.name(),
        row.topology,
        row.backend,
        figures.join(" | "),
        floor_cells.join(" | ") + " | " + &note,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::FloorKind;

    fn latency(ms: u64) -> Outcome {
        let samples = vec![Duration::from_millis(ms); 10];
        Outcome::Latency(Stats::of(samples, Duration::from_secs(1)))
    }

    fn row(scenario: Scenario, topology: &str, connections: usize, outcome: Outcome) -> Row {
        Row {
            scenario,
            topology: topology.into(),
            backend: "embedded".into(),
            connections: Some(connections),
            outcome,
            note: String::new(),
        }
    }

    #[test]
    fn a_figure_is_beside_its_floor_and_the_ratio() {
        let rows = [
            row(Scenario::Ack, "all-in-one", 16, latency(6)),
            row(
                Scenario::Ack,
                "split",
                64,
                Outcome::Failed("no\nway | out".into()),
            ),
        ];
        let floors = [
            row(Scenario::Ack, FloorKind::Commit.topology(), 16, latency(2)),
            row(Scenario::Ack, FloorKind::Grpc.topology(), 16, latency(1)),
        ];
        let table = table(&rows, &floors);
        assert!(
            table.contains(
                "| chat.send ack | all-in-one | embedded | 16 | 10 | 6.00 | 6.00 | 6.00 | 10 | (c) | 2.00 | 2.00 | 3.0 | 3.0 |  |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| chat.send ack | split | embedded | 64 | — | — | — | — | — | — | — | — | — | — | error: no way \\| out |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| chat.send ack | floor (b) ws+2 gRPC | embedded | 16 | 10 | 1.00 | 1.00 | 1.00 | 10 | — |"
            ),
            "{table}"
        );
    }
}
