//! `diagnostics.lanes`: the coordinators' work queues, as the Control UI's
//! Debug page shows them. The global cap is the `main` lane (its slots are
//! `--max-executing`, summed over the coordinators that own partitions);
//! the session lanes are the per-session lanes (OpenClaw's dynamic lanes).

use clawgate_common::clock::now_ms;
use run_coordinator_api::model::LaneStats;
use serde_json::{Value, json};

use super::{Answer, Call};

pub(super) async fn diagnostics_lanes(call: &Call<'_>) -> Answer {
    let stats = call
        .edge
        .backends
        .coordinator
        .describe_lanes()
        .await
        .map_err(super::backend_error)?;
    Ok(lanes_answer(stats, now_ms()))
}

/// The answer for `stats` at `ts`.
fn lanes_answer(stats: LaneStats, ts: i64) -> Value {
    let main = json!({
        "lane": "main", "queuedCount": stats.waiting, "activeCount": stats.executing,
        "maxConcurrent": stats.max_executing, "draining": stats.draining, "generation": 0,
        "blockedBy": null,
    });
    // No session lane at all is `null`, as OpenClaw has no dynamic lanes.
    let sessions = (stats.lanes > 0).then(|| {
        json!({
            "laneCount": stats.lanes, "activeCount": stats.lanes_running,
            "queuedCount": stats.waiting, "queuedLaneCount": stats.lanes_waiting,
        })
    });
    json!({ "ts": ts, "lanes": [main], "dynamic": sessions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_main_lane_and_sessions_are_dynamic() {
        let idle = LaneStats {
            max_executing: 16,
            ..LaneStats::default()
        };
        assert_eq!(
            lanes_answer(idle, 7),
            json!({
                "ts": 7, "dynamic": null,
                "lanes": [{
                    "lane": "main", "queuedCount": 0, "activeCount": 0, "maxConcurrent": 16,
                    "draining": false, "generation": 0, "blockedBy": null,
                }],
            })
        );
        let busy = LaneStats {
            max_executing: 2,
            executing: 2,
            waiting: 3,
            draining: false,
            lanes: 4,
            lanes_running: 2,
            lanes_waiting: 2,
        };
        let answer = lanes_answer(busy, 7);
        assert_eq!(
            answer["dynamic"],
            json!({ "laneCount": 4, "activeCount": 2, "queuedCount": 3, "queuedLaneCount": 2 })
        );
        assert_eq!(answer["lanes"][0]["queuedCount"], 3);
    }
}
