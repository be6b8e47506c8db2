//! A small terminal progress bar for long operator commands.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use holdfast_domain::text::thousands;

/// Draws `label [#####-----] 50% 5,000/10,000` on stderr: redrawn in place on a
/// terminal, and as a line per quarter when stderr is a file or pipe.
pub struct Progress {
    label: &'static str,
    tty: bool,
    last_quarter: u64,
    started: Instant,
}

impl Progress {
    /// A bar titled `label`.
    pub fn new(label: &'static str) -> Self {
        Self {
            label,
            tty: std::io::stderr().is_terminal(),
            last_quarter: 0,
            started: Instant::now(),
        }
    }

    /// Shows `done` of `total`.
    pub fn update(&mut self, done: u64, total: u64) {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let filled = (pct / 5) as usize;
            let _ = write!(
                err,
                "\r{} [{}{}] {:>3}% {}/{} ",
                self.label,
                "#".repeat(filled),
                "-".repeat(20 - filled),
                pct,
                thousands(done),
                thousands(total)
            );
            let _ = err.flush();
        } else if pct / 25 > self.last_quarter || done == total {
            self.last_quarter = pct / 25;
            let _ = writeln!(
                err,
                "{}: {}% ({}/{})",
                self.label,
                pct,
                thousands(done),
                thousands(total)
            );
        }
    }

    /// Ends the bar's line and returns the time since it was created.
    pub fn finish(self) -> std::time::Duration {
        if self.tty {
            let _ = writeln!(std::io::stderr());
        }
        self.started.elapsed()
    }
}

/// Prints `rows` as a two-column table on stdout.
pub fn table(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("  {k:<width$}  {v}");
    }
}
