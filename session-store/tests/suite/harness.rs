//! Fresh stores for tests: one per backend, optionally behind the gRPC server.

use std::sync::Arc;

use session_store::SessionStore;
use session_store::backend::embedded::{EmbeddedOptions, EmbeddedStore};
use session_store::backend::memory::MemoryStore;
use session_store::backend::postgres::{self, PgOptions, PostgresStore};

/// The PostgreSQL the tests use; `.ci/run` makes sure it is running.
pub use clawgate_system_tests::postgres_url;

pub struct Harness {
    store: Arc<dyn SessionStore>,
    pg_schema: Option<String>,
    _dir: Option<tempfile::TempDir>,
    server: Option<TestServer>,
}

impl Harness {
    pub fn store(&self) -> &dyn SessionStore {
        &*self.store
    }

    pub fn shared(&self) -> Arc<dyn SessionStore> {
        self.store.clone()
    }

    /// Swaps the store for another view of the same data (e.g. a gRPC client).
    pub fn with_store(mut self, store: Arc<dyn SessionStore>) -> Self {
        self.store = store;
        self
    }

    /// Drops the test's PostgreSQL schema. A panicking test leaves its
    /// schema behind (prefix `sstest_`), which is harmless.
    pub async fn finish(self) {
        drop(self.store);
        if let Some(server) = self.server {
            server.stop().await;
        }
        if let Some(schema) = self.pg_schema {
            postgres::drop_schema(&postgres_url(), &schema)
                .await
                .expect("drop test schema");
        }
    }
}

pub async fn memory() -> Harness {
    Harness {
        store: Arc::new(MemoryStore::new()),
        pg_schema: None,
        _dir: None,
        server: None,
    }
}

pub async fn embedded() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("store.redb"), EmbeddedOptions::default())
        .await
        .expect("open embedded store");
    Harness {
        store: Arc::new(store),
        pg_schema: None,
        _dir: Some(dir),
        server: None,
    }
}

pub async fn postgres() -> Harness {
    let schema = format!("sstest_{}", uuid::Uuid::new_v4().simple());
    let options = PgOptions {
        schema: Some(schema.clone()),
        ..PgOptions::default()
    };
    let store = PostgresStore::connect(&postgres_url(), options)
        .await
        .expect("connect to PostgreSQL (is it running? see README)");
    Harness {
        store: Arc::new(store),
        pg_schema: Some(schema),
        _dir: None,
        server: None,
    }
}

/// A running session-store gRPC server on port 0, stopped when dropped.
pub struct TestServer {
    pub address: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    pub async fn start(
        backend: Arc<dyn SessionStore>,
        options: session_store::server::ServeOptions,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(session_store::server::serve_store(
            backend,
            options,
            listener,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            address,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub async fn remote(&self) -> session_store::grpc::client::RemoteStore {
        session_store::grpc::client::RemoteStore::connect(&self.url())
            .await
            .expect("connect to the test server")
    }

    /// Stops the server and waits until it has drained.
    pub async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
    }
}

/// The same backend, reached through the gRPC server and `RemoteStore`.
pub async fn over_grpc(harness: Harness) -> Harness {
    let server = TestServer::start(harness.shared(), Default::default()).await;
    let remote = server.remote().await;
    let mut harness = harness.with_store(Arc::new(remote));
    harness.server = Some(server);
    harness
}

pub async fn grpc_memory() -> Harness {
    over_grpc(memory().await).await
}

pub async fn grpc_embedded() -> Harness {
    over_grpc(embedded().await).await
}

pub async fn grpc_postgres() -> Harness {
    over_grpc(postgres().await).await
}
