//! Fresh stores for the systems the bench starts: a temp directory for the
//! embedded backend, a fresh PostgreSQL database (`clawgate_bench_<uuid>`,
//! dropped after) for PostgreSQL.

use std::sync::Mutex;

use anyhow::Context;

/// A store backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    /// Databases are made and dropped through `admin_url` (a database URL
    /// of a user that may create databases).
    Postgres {
        admin_url: String,
    },
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Postgres { .. } => "postgres",
        }
    }

    /// A store nobody used yet.
    pub async fn fresh(&self) -> anyhow::Result<Store> {
        match self {
            Self::Embedded => {
                let dir = tempfile::Builder::new()
                    .prefix("clawgate-bench-")
                    .tempdir()
                    .context("a temporary store directory")?;
                Ok(Store {
                    location: dir.path().join("store.redb").to_string_lossy().into_owned(),
                    dir: Some(dir),
                    database: None,
                })
            }
            Self::Postgres { admin_url } => {
                let name = format!("clawgate_bench_{}", uuid::Uuid::new_v4().simple());
                execute(admin_url, &format!("CREATE DATABASE \"{name}\"")).await?;
                CREATED
                    .lock()
                    .unwrap()
                    .push((admin_url.clone(), name.clone()));
                eprintln!("created database {name}");
                Ok(Store {
                    location: with_database(admin_url, &name)?,
                    dir: None,
                    database: Some((admin_url.clone(), name)),
                })
            }
        }
    }
}

/// Databases made and not dropped yet (for [`drop_leftovers`]).
static CREATED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// A fresh store: `location` is what `--store` takes.
pub struct Store {
    pub location: String,
    dir: Option<tempfile::TempDir>,
    /// The admin URL and the database's name.
    database: Option<(String, String)>,
}

impl Store {
    /// Removes the directory or drops the database.
    pub async fn remove(mut self) -> anyhow::Result<()> {
        drop(self.dir.take());
        if let Some((admin_url, name)) = self.database.take() {
            drop_database(&admin_url, &name).await?;
        }
        Ok(())
    }
}

async fn drop_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    execute(
        admin_url,
        &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
    )
    .await?;
    CREATED.lock().unwrap().retain(|(_, n)| n != name);
    eprintln!("dropped database {name}");
    Ok(())
}

/// Drops every database made and not dropped yet (after an interrupt).
pub async fn drop_leftovers() {
    let leftovers = std::mem::take(&mut *CREATED.lock().unwrap());
    for (admin_url, name) in leftovers {
        if let Err(e) = drop_database(&admin_url, &name).await {
            eprintln!("could not drop database {name}: {e:#}");
        }
    }
}

async fn execute(url: &str, statement: &str) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to PostgreSQL at {url}"))?;
    let connection = tokio::spawn(connection);
    client
        .batch_execute(statement)
        .await
        .with_context(|| format!("PostgreSQL: {statement}"))?;
    drop(client);
    let _ = connection.await;
    Ok(())
}

/// `url` naming database `name` instead (the query, if any, kept).
pub fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .context("a PostgreSQL URL is scheme://…")?;
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let mut out = format!("{scheme}://{authority}/{name}");
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_the_database_of_a_url() {
        let swap = |url| with_database(url, "fresh").unwrap();
        assert_eq!(
            swap("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/fresh"
        );
        assert_eq!(
            swap("postgresql://u:p@h/test?sslmode=disable"),
            "postgresql://u:p@h/fresh?sslmode=disable"
        );
        assert_eq!(swap("postgres://h:1"), "postgres://h:1/fresh");
    }
}
