//! The run events of a replayed connection compared with the recording's:
//! the `chat` and `agent` events clients render (deltas with their
//! `deltaText`, the final or aborted end, the lifecycle, the assistant
//! stream), member by member as the recording has them.

use serde_json::Value;

/// The event kinds compared: (event, the payload member that tells its
/// kind, that member's value).
const COMPARED: &[(&str, &str, &str)] = &[
    ("chat", "state", "delta"),
    ("chat", "state", "final"),
    ("chat", "state", "aborted"),
    ("agent", "stream", "lifecycle"),
    ("agent", "stream", "assistant"),
];

fn of_kind<'a>(
    frames: impl Iterator<Item = &'a Value>,
    (event, by, kind): (&str, &str, &str),
) -> Vec<&'a Value> {
    frames
        .filter(|f| f["type"] == "event" && f["event"] == event && f["payload"][by] == kind)
        .collect()
}

/// A value's JSON type, as JSON Schema names it.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// What clients read of each compared event (`a.b`: member `b` of `a`;
/// a leading `=`: the value must equal the recorded one, else only its
/// JSON type): the members the CLI, the TUI and the Control UI use to
/// render a run. The real gateway sends more (`sessionId`, `itemId`,
/// `livenessState`, `terminalReceipt`, …), which none of them reads.
fn contract(kind: (&str, &str, &str), phase: &str) -> &'static [&'static str] {
    match (kind.0, kind.2, phase) {
        ("chat", "delta", _) => &[
            "=runId",
            "=sessionKey",
            "seq",
            "=state",
            "deltaText",
            "message.role",
            "message.content",
        ],
        ("chat", "final", _) => &[
            "=runId",
            "=sessionKey",
            "seq",
            "=state",
            "=stopReason",
            "message.role",
            "message.content",
        ],
        // An aborted run's partial `message` exists only if it had
        // streamed before the stop.
        ("chat", "aborted", _) => &["=runId", "=sessionKey", "seq", "=state", "=stopReason"],
        ("agent", "lifecycle", "start") => &[
            "=runId",
            "=sessionKey",
            "=stream",
            "seq",
            "ts",
            "=data.phase",
            "data.startedAt",
        ],
        ("agent", "lifecycle", _) => &[
            "=runId",
            "=stream",
            "seq",
            "ts",
            "=data.phase",
            "data.endedAt",
            "=data.aborted",
            "=data.stopReason",
        ],
        _ => &["=runId", "=stream", "seq", "ts", "data.text", "data.delta"],
    }
}

/// Checks the contract members of `ours` against `recorded` (a member the
/// recording lacks is not checked).
fn check_contract(at: &str, members: &[&str], recorded: &Value, ours: &Value) {
    for member in members {
        let (exact, path) = match member.strip_prefix('=') {
            Some(path) => (true, path),
            None => (false, *member),
        };
        let get = |value: &Value| path.split('.').fold(value.clone(), |v, key| v[key].clone());
        let (theirs, mine) = (get(recorded), get(ours));
        if theirs.is_null() {
            continue;
        }
        assert_eq!(
            json_type(&mine),
            json_type(&theirs),
            "{at}: member {path}\nrecorded {recorded}\nours     {ours}"
        );
        if exact {
            assert_eq!(
                mine, theirs,
                "{at}: member {path}\nrecorded {recorded}\nours     {ours}"
            );
        }
    }
}

/// Compares the run events `received` on a replayed connection with those
/// of the recorded connection (`records`, its lines).
pub fn compare_run_events(file: &str, records: &[Value], received: &[Value]) {
    let recorded: Vec<&Value> = records
        .iter()
        .filter(|r| r["dir"] == "s2c")
        .map(|r| &r["json"])
        .collect();
    for &kind in COMPARED {
        let theirs = of_kind(recorded.iter().copied(), kind);
        // Lifecycle events compare phase by phase (this edge sends start
        // and end or error; the gateway's other phases, such as
        // `finishing`, have no counterpart here).
        let phase = |f: &Value| {
            f["payload"]["data"]["phase"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        // The real gateway follows an aborted run's `end` with a late
        // `error` from the cancelled model call; this edge ends a run once.
        let mut seen = Vec::new();
        for first in theirs {
            let sub = phase(first);
            let late_error = sub == "error" && seen.iter().any(|p| p == "end");
            if late_error
                || seen.contains(&sub)
                || !["", "start", "end", "error"].contains(&sub.as_str())
            {
                continue;
            }
            seen.push(sub.clone());
            let run_id = &first["payload"]["runId"];
            let ours: Vec<&Value> = of_kind(received.iter(), kind)
                .into_iter()
                .filter(|f| f["payload"]["runId"] == *run_id && phase(f) == sub)
                .collect();
            let at = format!("{file}: {} {} {sub} of run {run_id}", kind.0, kind.2);
            assert!(!ours.is_empty(), "{at}: none received");
            check_contract(
                &at,
                contract(kind, &sub),
                &first["payload"],
                &ours[0]["payload"],
            );
        }
    }
    // The lifecycle starts and ends as recorded (its phases this edge
    // sends: start, then end or error; a late error after an end aside).
    let phases = |frames: Vec<&Value>| -> Vec<String> {
        let mut phases: Vec<String> = Vec::new();
        for phase in frames
            .iter()
            .filter_map(|f| f["payload"]["data"]["phase"].as_str())
        {
            let late_error = phase == "error" && phases.iter().any(|p| p == "end");
            if ["start", "end", "error"].contains(&phase) && !late_error {
                phases.push(phase.to_owned());
            }
        }
        phases
    };
    let lifecycle = ("agent", "stream", "lifecycle");
    let theirs = phases(of_kind(recorded.iter().copied(), lifecycle));
    if let (Some(first), Some(last)) = (theirs.first(), theirs.last()) {
        let ours = phases(of_kind(received.iter(), lifecycle));
        // A recorded connection that joined mid-run saw no start; ours may
        // have joined before the run started here.
        if first == "start" {
            assert_eq!(
                ours.first().map(String::as_str),
                Some("start"),
                "{file}: lifecycle {ours:?} vs {theirs:?}"
            );
        }
        assert_eq!(
            ours.last(),
            Some(last),
            "{file}: lifecycle {ours:?} vs {theirs:?}"
        );
    }
    // A finished run's deltas add up to its final text, each one's
    // `deltaText` the piece it adds (on a connection that saw it start: one
    // that joined later, as `agent.wait`'s does, sees only the rest).
    for end in of_kind(received.iter(), ("chat", "state", "final")) {
        let run_id = &end["payload"]["runId"];
        let saw_start = of_kind(received.iter(), lifecycle)
            .iter()
            .any(|f| f["payload"]["runId"] == *run_id && f["payload"]["data"]["phase"] == "start");
        if !saw_start {
            continue;
        }
        let text = |f: &Value| {
            f["payload"]["message"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let deltas: String = of_kind(received.iter(), ("chat", "state", "delta"))
            .into_iter()
            .filter(|f| f["payload"]["runId"] == *run_id)
            .map(|f| {
                f["payload"]["deltaText"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(deltas, text(end), "{file}: run {run_id}: deltas vs final");
    }
}
