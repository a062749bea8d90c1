//! Calling the run coordinator from your own service, over gRPC.
//!
//! Start the all-in-one server, then run this example:
//!
//! ```sh
//! cargo run --release -p clawgate            # terminal 1
//! cargo run -p run-coordinator --example submit_and_wait -- "hello there"
//! ```
//!
//! It submits a run (the idempotency key is the runId: submitting it again
//! never runs twice), follows the run's events live, then waits for the
//! terminal result.

use clawgate_proto::run_coordinator::v1 as pb;
use clawgate_proto::run_coordinator::v1::run_coordinator_client::RunCoordinatorClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let message = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "hello from an internal service".into());
    let address =
        std::env::var("COORDINATOR_ADDRESS").unwrap_or_else(|_| "http://127.0.0.1:50062".into());
    let mut client = RunCoordinatorClient::connect(address).await?;

    // One business intent = one idempotency key. Retrying this exact request
    // (say, after a timeout) answers IN_FLIGHT or the finished result.
    let run_id = format!("example-{}", std::process::id());
    let ack = client
        .submit(pb::SubmitRequest {
            run_id: run_id.clone(),
            session_key: "main".into(),
            kind: "agent".into(),
            message,
            ..Default::default()
        })
        .await?
        .into_inner();
    println!("admission: {:?}", pb::Admission::try_from(ack.admission)?);

    // Follow the run: replay from the start, then live, until it ends.
    let mut events = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::subscribe_request::Filter::RunId(run_id.clone())),
            from_seq: 0,
            epoch: String::new(),
        })
        .await?
        .into_inner();
    while let Some(item) = events.message().await? {
        match item.item {
            Some(pb::subscribe_response::Item::Event(event)) => match event.body {
                Some(pb::run_event::Body::Assistant(a)) => {
                    println!("#{} delta {:?}", event.seq, a.delta)
                }
                Some(body) => println!("#{} {body:?}", event.seq),
                None => {}
            },
            Some(pb::subscribe_response::Item::Reset(reset)) => {
                println!("stream reset ({}): reload from history", reset.reason);
                break;
            }
            Some(pb::subscribe_response::Item::Subscribed(_)) | None => {}
        }
    }

    // Wait observes only; a timeout here would not cancel the run.
    let waited = client
        .wait(pb::WaitRequest {
            run_id,
            timeout_ms: 30_000,
        })
        .await?
        .into_inner();
    let snapshot = waited.snapshot.expect("a known run");
    println!(
        "terminal: {}, status: {:?}, text: {:?}",
        waited.terminal,
        clawgate_proto::session_store::v1::RunStatus::try_from(snapshot.status)?,
        snapshot.text
    );
    Ok(())
}
