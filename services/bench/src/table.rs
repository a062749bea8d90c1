//! The report: one Markdown table, each figure beside its floor and the
//! ratio of the two.

use std::time::Duration;

use crate::scenarios::idle::Memory;
use crate::{Scenario, Stats};

/// What a scenario measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Latency(Stats),
    /// `idle`.
    Memory(Memory),
    /// It could not be measured: why.
    Failed(String),
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
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Failed(_))
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

/// `rows`, each with its floor from `floors`, then the floors themselves.
pub fn table(rows: &[Row], floors: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | topology | backend | connections | count | p50 ms | p99 ms | max ms | per second | floor | floor p50 ms | floor p99 ms | ratio p50 | ratio p99 | note |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let dash = "—".to_owned();
    for row in rows.iter().chain(floors) {
        let connections = row.connections.map_or(dash.clone(), |c| c.to_string());
        let (count, figures, note) = match &row.outcome {
            Outcome::Latency(stats) => {
                let rate = match row.scenario {
                    Scenario::Startup => dash.clone(),
                    _ => format!("{:.0}", stats.rate),
                };
                let figures = [ms(stats.p50), ms(stats.p99), ms(stats.max), rate];
                (stats.count.to_string(), figures, cell(&row.note))
            }
            Outcome::Memory(memory) => (
                memory.opened.to_string(),
                [dash.clone(), dash.clone(), dash.clone(), dash.clone()],
                cell(&row.note),
            ),
            Outcome::Failed(error) => (
                dash.clone(),
                [dash.clone(), dash.clone(), dash.clone(), dash.clone()],
                cell(&format!("error: {error}")),
            ),
        };
        let is_floor = floors.iter().any(|f| std::ptr::eq(f, row));
        let floor = if is_floor {
            None
        } else {
            floor_of(row, floors)
        };
        let floor_cells = match (floor, row.latency()) {
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
        out.push_str(&format!(
            "| {} | {} | {} | {connections} | {count} | {} | {} |\n",
            row.scenario.name(),
            row.topology,
            row.backend,
            figures.join(" | "),
            floor_cells.join(" | ") + " | " + &note,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::floor::FloorKind;

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
