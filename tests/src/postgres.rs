//! The PostgreSQL the tests use, and a schema of a test's own in it. A
//! missing PostgreSQL fails the test that needs it: never a skip.

/// Where the tests' PostgreSQL is: `CLAWGATE_TEST_POSTGRES_URL`, or the
/// local one `.ci/run` makes sure is running.
pub fn postgres_url() -> String {
    std::env::var("CLAWGATE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema name no other test uses: `prefix` and a fresh UUID.
pub fn fresh_schema(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

/// Drops `schema` from the PostgreSQL at `server` (a panicking test leaves
/// its schema behind, which is harmless).
pub async fn drop_schema(server: &str, schema: &str) {
    session_store::backend::postgres::drop_schema(server, schema)
        .await
        .unwrap_or_else(|e| panic!("cannot drop the test's schema {schema}: {e}"));
}
