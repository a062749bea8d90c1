//! Descriptor-driven gRPC fuzzing: for every method of a service, as the
//! descriptor set of `clawgate-proto` describes it (so a method or field
//! added to a proto is fuzzed without anyone listing it), proptest generates
//! requests ([`generate`]), sends them as raw bytes ([`client`]) and checks
//! each case:
//!
//! 1. the answer is OK or a clean refusal ([`client::clean`]) sent by the
//!    server (not one the client's transport made of a reset stream or a
//!    lost connection, [`client::broken`]), in time, and it decodes as the
//!    method's output type (a server stream is read for a bounded time,
//!    then dropped);
//! 2. no thread of the test process panicked meanwhile — the servers run
//!    in-process, and [`record_panics`] hooks every panic;
//! 3. the service still answers: its health check is SERVING and the test's
//!    own valid request (the probe) succeeds.
//!
//! The test gives a dictionary (ids of what it created) and may give valid
//! seed requests ([`Seeds`]) that half of the cases mutate, so that calls
//! get past the first check. Cases are deterministic: each method's runner is seeded from a fixed
//! seed and the method's path (`PROTO_FUZZ_SEED` and `PROTO_FUZZ_CASES`
//! override the seed and the cases per method).

pub mod client;
pub mod generate;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, Once};

use bytes::Bytes;
use futures::future::BoxFuture;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MethodDescriptor};
use tonic::transport::Channel;

pub use client::{CallLimits, Outcome, RawCodec, broken, call, clean, path_of, serving};
pub use generate::{Case, message};

/// Every proto of the project, from the descriptor set the build embeds.
pub fn pool() -> DescriptorPool {
    DescriptorPool::decode(clawgate_proto::FILE_DESCRIPTOR_SET)
        .expect("clawgate-proto embeds a valid descriptor set")
}

/// The methods of `service` (its full name, e.g.
/// `clawgate.session_store.v1.SessionStore`), in declaration order.
pub fn methods(service: &str) -> Vec<MethodDescriptor> {
    pool()
        .get_service_by_name(service)
        .unwrap_or_else(|| panic!("no service {service} in the descriptor set"))
        .methods()
        .collect()
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// Records every panic of any thread of this process from now on (and
/// still prints it as before). Idempotent. The hook is process-wide: a test
/// binary should fuzz from one `#[test]` only (one service after another),
/// so that no other test's panic is counted against a case.
pub fn record_panics() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            let location = info
                .location()
                .map_or_else(String::new, |l| format!(" at {l}"));
            PANICS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(format!(
                    "thread {:?} panicked{location}: {message}",
                    thread.name().unwrap_or("?")
                ));
            previous(info);
        }));
    });
}

/// The panics recorded since the last call (see [`record_panics`]).
pub fn take_panics() -> Vec<String> {
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// A valid request the service must still serve after every case.
pub type Probe<'a> = &'a dyn Fn(Channel) -> BoxFuture<'static, Result<(), String>>;

/// One service under fuzz.
pub struct Fuzz<'a> {
    /// Runs the calls; the test thread itself must not be inside it.
    pub runtime: &'a tokio::runtime::Runtime,
    pub channel: Channel,
    /// Full name of the service in the descriptor set.
    pub service: &'a str,
    /// Full name its health check is registered under.
    pub health: &'a str,
    /// Strings meaningful to the service (ids of what the test created).
    pub dictionary: Vec<String>,
    /// Valid requests to mutate, by method (see [`Seeds`]).
    pub seeds: Seeds,
    /// Cases per method (unless `PROTO_FUZZ_CASES` says otherwise).
    pub cases: u32,
    pub seed: u64,
    pub limits: CallLimits,
}

/// Valid requests the generator mutates, by method path.
#[derive(Debug, Clone, Default)]
pub struct Seeds(BTreeMap<String, Vec<DynamicMessage>>);

impl Seeds {
    /// Adds `request` as a seed of the method at `path`
    /// (`/package.Service/Method`). Panics when the descriptor set has no
    /// such method, so a seed cannot silently outlive a renamed method.
    pub fn with(mut self, path: &str, request: &impl Message) -> Self {
        let (service, name) = path
            .trim_start_matches('/')
            .rsplit_once('/')
            .unwrap_or_else(|| panic!("{path:?} is not /package.Service/Method"));
        let method = methods(service)
            .into_iter()
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("no method {path} in the descriptor set"));
        let decoded = DynamicMessage::decode(method.input(), request.encode_to_vec().as_slice())
            .unwrap_or_else(|e| panic!("the seed is not a {}: {e}", method.input().full_name()));
        self.0.entry(path.to_owned()).or_default().push(decoded);
        self
    }

    fn of(&self, path: &str) -> &[DynamicMessage] {
        self.0.get(path).map_or(&[], Vec::as_slice)
    }
}

/// What a fuzz run saw: the codes each method answered with, and every
/// failing method's first failing case and minimal failing case.
#[derive(Debug, Default)]
pub struct Report {
    pub codes: BTreeMap<String, BTreeMap<String, usize>>,
    pub failures: Vec<String>,
}

impl Report {
    /// Adds `other`'s codes and failures, its methods prefixed with `label`.
    pub fn merge(&mut self, label: &str, other: Report) {
        for (method, codes) in other.codes {
            self.codes.insert(format!("{label} {method}"), codes);
        }
        self.failures.extend(
            other
                .failures
                .into_iter()
                .map(|failure| format!("{label}: {failure}")),
        );
    }

    /// Panics with every failure, if any.
    pub fn assert_clean(&self) {
        assert!(
            self.failures.is_empty(),
            "{} method(s) failed:\n\n{}\n\n{self}",
            self.failures.len(),
            self.failures.join("\n\n")
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (method, codes) in &self.codes {
            writeln!(f, "{method}: {codes:?}")?;
        }
        Ok(())
    }
}

/// A 32-byte ChaCha seed from the run's seed and the method's path (FNV-1a),
/// so that adding a method leaves the cases of the others as they were.
fn seed_for(seed: u64, path: &str) -> [u8; 32] {
    let mut state = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        for byte in path.bytes().chain([i as u8]) {
            state = (state ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    out
}

/// A proptest runner that draws the same cases on every run: `cases` cases,
/// at most `max_shrink_iters` shrink steps, its stream of randomness fixed by
/// `seed` and `label` (a method's path or name, so methods differ), nothing
/// persisted between runs.
pub fn seeded_runner(cases: u32, max_shrink_iters: u32, seed: u64, label: &str) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters,
        rng_algorithm: RngAlgorithm::ChaCha,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_for(seed, label));
    TestRunner::new_with_rng(config, rng)
}

/// Why a case failed.
enum Failure {
    /// The call itself (its answer, or a panic while the service goes on).
    Call(String),
    /// The service stopped answering after the call.
    Wedged(String),
}

/// The value of variable `name` when it parses, else `default` (how a run
/// overrides its case count or seed).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Fuzz<'_> {
    /// Whether the service answers at all: SERVING and the probe succeeds.
    async fn answers(&self, probe: Probe<'_>) -> Result<(), String> {
        serving(self.channel.clone(), self.health).await?;
        probe(self.channel.clone())
            .await
            .map_err(|e| format!("a valid request failed: {e}"))
    }

    /// One case: the call, then the checks of the module doc.
    async fn case(
        &self,
        method: &MethodDescriptor,
        request: Bytes,
        probe: Probe<'_>,
    ) -> Result<Outcome, Failure> {
        let called = client::call(self.channel.clone(), method, request, &self.limits)
            .await
            .and_then(|outcome| match &outcome {
                Outcome::Failed(status) if !clean(status.code()) || client::broken(status) => {
                    Err(format!("not a clean status: {status:?}"))
                }
                _ => Ok(outcome),
            });
        let answers = self.answers(probe).await;
        let panics = take_panics();
        let mut why: Vec<String> = called.as_ref().err().cloned().into_iter().collect();
        if !panics.is_empty() {
            why.push(format!("the process panicked:\n  {}", panics.join("\n  ")));
        }
        match answers {
            Err(e) => {
                why.push(format!("after the call: {e}"));
                Err(Failure::Wedged(why.join("\n  ")))
            }
            Ok(()) if !why.is_empty() => Err(Failure::Call(why.join("\n  "))),
            Ok(()) => Ok(called.expect("no failure")),
        }
    }

    /// Fuzzes every method of the service; see the module doc.
    pub fn run(&self, probe: Probe<'_>) -> Report {
        record_panics();
        let cases = env_or("PROTO_FUZZ_CASES", self.cases);
        let seed = env_or("PROTO_FUZZ_SEED", self.seed);
        let mut report = Report::default();
        for method in methods(self.service) {
            let path = path_of(&method);
            if let Err(e) = self.runtime.block_on(self.answers(probe)) {
                report
                    .failures
                    .push(format!("{path}: not fuzzed, the service is down: {e}"));
                continue;
            }
            let codes = RefCell::new(BTreeMap::<String, usize>::new());
            let first_failure = RefCell::new(None::<String>);
            // Once a case wedged the service, every later one passes: a
            // shrink step against a dead service would blame any input, so
            // the case reported is the one that wedged it.
            let wedged = std::cell::Cell::new(false);
            let mut runner = seeded_runner(cases, 64, seed, &path);
            let strategy = message(&method.input(), &self.dictionary, self.seeds.of(&path));
            let result = runner.run(&strategy, |Case(request)| {
                if wedged.get() {
                    return Ok(());
                }
                let body = Bytes::from(request.encode_to_vec());
                let checked = self.runtime.block_on(self.case(&method, body, probe));
                let checked = checked.map_err(|failure| match failure {
                    Failure::Call(why) => why,
                    Failure::Wedged(why) => {
                        wedged.set(true);
                        why
                    }
                });
                match checked {
                    Ok(outcome) => {
                        *codes
                            .borrow_mut()
                            .entry(format!("{:?}", outcome.code()))
                            .or_default() += 1;
                        Ok(())
                    }
                    Err(why) => {
                        first_failure.borrow_mut().get_or_insert_with(|| {
                            format!("{why}\n  request: {:?}", Case(request))
                        });
                        Err(TestCaseError::fail(why))
                    }
                }
            });
            match result {
                Ok(()) => {}
                Err(TestError::Fail(why, minimal)) => report.failures.push(format!(
                    "{path} (seed {seed}): {why}\n  minimal request: {minimal:?}\n  first failure: {}",
                    first_failure.borrow().as_deref().unwrap_or("?")
                )),
                Err(TestError::Abort(why)) => {
                    report.failures.push(format!("{path}: aborted: {why}"));
                }
            }
            report.codes.insert(path, codes.into_inner());
        }
        // A panic after the last case still counts.
        let late = take_panics();
        if !late.is_empty() {
            report.failures.push(format!(
                "panics after the last case:\n  {}",
                late.join("\n  ")
            ));
        }
        report
    }
}
