//! The report as it is measured: the table's header at once, then each row
//! the moment its scenario ends, on stdout and appended to `--out` (each
//! line flushed), so that a run cut short still leaves every row it
//! measured. The floors are measured first, so that each row is printed
//! beside its floor.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;

use crate::table::{self, Row};

pub struct Report {
    inner: Mutex<Inner>,
}

struct Inner {
    file: Option<File>,
    rows: Vec<Row>,
    floors: Vec<Row>,
}

impl Report {
    /// Prints the header, and appends it to `out` (created if missing).
    pub fn start(out: Option<&Path>) -> anyhow::Result<Self> {
        let file = out
            .map(|path| {
                File::options()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))
            })
            .transpose()?;
        let report = Self {
            inner: Mutex::new(Inner {
                file,
                rows: Vec::new(),
                floors: Vec::new(),
            }),
        };
        report.inner.lock().unwrap().write(table::HEADER);
        Ok(report)
    }

    /// A figure's row, beside its floor if that was measured.
    pub fn row(&self, row: Row) {
        let mut inner = self.inner.lock().unwrap();
        let line = table::line(&row, &inner.floors);
        inner.write(&line);
        inner.rows.push(row);
    }

    /// A floor's row.
    pub fn floor(&self, row: Row) {
        let mut inner = self.inner.lock().unwrap();
        inner.write(&table::line(&row, &[]));
        inner.floors.push(row);
    }

    /// Every row reported: the figures' and the floors'.
    pub fn finish(self) -> (Vec<Row>, Vec<Row>) {
        let inner = self.inner.into_inner().unwrap();
        (inner.rows, inner.floors)
    }
}

impl Inner {
    /// To the file first: a reader of stdout then finds the file as far
    /// along. A closed stdout (a pipe whose reader left) loses nothing there.
    fn write(&mut self, text: &str) {
        if let Some(file) = &mut self.file
            && let Err(e) = file.write_all(text.as_bytes()).and_then(|()| file.flush())
        {
            eprintln!("warning: appending to the output file: {e}");
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
}
